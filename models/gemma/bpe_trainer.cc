#include "models/gemma/bpe_trainer.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/gemma/utf8.h"

namespace tpudist::models::gemma {
namespace {

// Words of the normalised corpus with their counts.
std::map<std::string, int64_t> CountWords(const std::string& text) {
  std::map<std::string, int64_t> counts;
  std::string cur;
  for (absl::string_view ch : SplitUtf8(text)) {
    if (ch == kMetaspace || ch == "\n") {
      if (!cur.empty()) ++counts[cur];
      cur.clear();
      if (ch == "\n") {
        ++counts["\n"];
        continue;
      }
    }
    cur.append(ch.data(), ch.size());
  }
  if (!cur.empty()) ++counts[cur];
  return counts;
}

}  // namespace

absl::StatusOr<BpeModel> TrainBpe(absl::string_view corpus, const BpeTrainerOptions& options) {
  const std::string text = ReplaceAll(corpus, " ", kMetaspace);
  BpeModel model;
  std::set<std::string> seen;
  auto add = [&](const std::string& tok) {
    if (seen.insert(tok).second) model.vocab.push_back(tok);
  };
  for (const auto& s : options.special_tokens) add(s);
  model.num_special = static_cast<int64_t>(model.vocab.size());
  for (int b = 0; b < 256; ++b) add(absl::StrFormat("<0x%02X>", b));
  std::map<std::string, int64_t> char_counts;
  for (absl::string_view ch : SplitUtf8(text)) ++char_counts[std::string(ch)];
  std::vector<std::pair<std::string, int64_t>> chars(char_counts.begin(), char_counts.end());
  std::stable_sort(chars.begin(), chars.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  for (const auto& [c, n] : chars) add(c);
  if (static_cast<int64_t>(model.vocab.size()) > options.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("TrainBpe: vocab_size ", options.vocab_size, " < ",
                                                   model.vocab.size(), " specials + bytes + corpus characters"));
  }
  // Each distinct word as a symbol sequence.
  std::vector<std::pair<std::vector<std::string>, int64_t>> words;
  for (const auto& [w, n] : CountWords(text)) {
    std::vector<std::string> syms;
    for (absl::string_view ch : SplitUtf8(w)) syms.emplace_back(ch);
    words.emplace_back(std::move(syms), n);
  }
  while (static_cast<int64_t>(model.vocab.size()) < options.vocab_size) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const auto& [syms, n] : words) {
      for (size_t i = 0; i + 1 < syms.size(); ++i) pairs[{syms[i], syms[i + 1]}] += n;
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int64_t best_n = 0;
    for (const auto& [p, n] : pairs) {  // map order: lexicographic, so ties keep the smallest
      if (n > best_n) {
        best = &p;
        best_n = n;
      }
    }
    if (best == nullptr) break;
    const auto merge = *best;
    const std::string merged = merge.first + merge.second;
    model.merges.push_back(merge);
    add(merged);
    for (auto& [syms, n] : words) {
      std::vector<std::string> out;
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == merge.first && syms[i + 1] == merge.second) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(syms[i]);
        }
      }
      syms.swap(out);
    }
  }
  return model;
}

nlohmann::json BpeTokenizerJson(const BpeModel& model) {
  using nlohmann::json;
  json vocab = json::object();
  for (size_t i = 0; i < model.vocab.size(); ++i) vocab[model.vocab[i]] = i;
  json merges = json::array();
  for (const auto& [a, b] : model.merges) merges.push_back(json::array({a, b}));
  json added = json::array();
  for (int64_t i = 0; i < model.num_special; ++i) {
    added.push_back({{"id", i}, {"content", model.vocab[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  const bool has_unk = std::find(model.vocab.begin(), model.vocab.end(), "<unk>") != model.vocab.end();
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", std::string(kMetaspace)}}},
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", std::string(kMetaspace)}}}, {"content", " "}},
                                  {{"type", "ByteFallback"}},
                                  {{"type", "Fuse"}}})}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", has_unk ? json("<unk>") : json(nullptr)},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}},
  };
}

}  // namespace tpudist::models::gemma
