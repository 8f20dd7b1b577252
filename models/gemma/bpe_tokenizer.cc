#include "models/gemma/bpe_tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/gemma/gemma_config.h"
#include "models/gemma/utf8.h"

namespace tpudist::models::gemma {
namespace {

using nlohmann::json;

absl::Status Bad(absl::string_view source, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": field '", field, "': ", what));
}

std::string StringField(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// j[key] when it is a boolean / an integer, `fallback` when absent or null,
// else an error naming `field`.key (json::value would throw).
absl::StatusOr<bool> BoolField(const json& j, const char* key, bool fallback, absl::string_view source,
                               absl::string_view field) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Bad(source, absl::StrCat(field, ".", key), "not a boolean");
  return it->get<bool>();
}
absl::StatusOr<int64_t> IntField(const json& j, const char* key, int64_t fallback, absl::string_view source,
                                 absl::string_view field) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) return Bad(source, absl::StrCat(field, ".", key), "not an integer");
  return it->get<int64_t>();
}

#define BPE_ASSIGN_OR_RETURN(lhs, expr) \
  do {                                  \
    auto _v = (expr);                   \
    if (!_v.ok()) return _v.status();   \
    lhs = *_v;                          \
  } while (0)

// A tokenizer_config.json token entry: "<bos>" or {"content": "<bos>", ...}.
std::string TokenString(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object()) return StringField(j, "content");
  return "";
}

// Flattens a normalizer / pre_tokenizer / decoder into steps.
absl::Status ParseSteps(const json& j, absl::string_view source, absl::string_view field,
                        const std::vector<std::string>& supported, std::vector<json>* out) {
  if (j.is_null()) return absl::OkStatus();
  if (!j.is_object()) return Bad(source, field, "not an object");
  const std::string type = StringField(j, "type");
  if (type == "Sequence") {
    const char* key = j.contains("normalizers") ? "normalizers" : j.contains("pretokenizers") ? "pretokenizers" : "decoders";
    if (!j.contains(key) || !j[key].is_array()) return Bad(source, field, "Sequence without a list");
    for (const auto& e : j[key]) {
      if (auto st = ParseSteps(e, source, field, supported, out); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  if (std::find(supported.begin(), supported.end(), type) == supported.end()) {
    return Bad(source, field, absl::StrCat("unsupported type '", type, "'"));
  }
  out->push_back(j);
  return absl::OkStatus();
}

// Pattern of Replace/Split: {"String": " "}; Regex patterns are unsupported.
absl::StatusOr<std::string> PatternString(const json& j, absl::string_view source, absl::string_view field) {
  auto it = j.find("pattern");
  if (it == j.end()) return Bad(source, field, "missing pattern");
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("String") && (*it)["String"].is_string()) {
    return (*it)["String"].get<std::string>();
  }
  return Bad(source, field, "only String patterns are supported (no Regex)");
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromJson(const json& tok, const json& config,
                                                                      absl::string_view source,
                                                                      std::optional<bool> add_bos) {
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  if (!tok.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  auto model = tok.find("model");
  if (model == tok.end() || !model->is_object()) return Bad(source, "model", "missing");
  if (StringField(*model, "type") != "BPE") {
    return Bad(source, "model.type", absl::StrCat("want BPE, got '", StringField(*model, "type"), "'"));
  }
  auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object()) return Bad(source, "model.vocab", "missing");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model->contains(k) && !(*model)[k].is_null() &&
        (!(*model)[k].is_string() || !(*model)[k].get<std::string>().empty())) {
      return Bad(source, absl::StrCat("model.", k), "not supported");
    }
  }
  if (model->contains("dropout") && (*model)["dropout"].is_number() && (*model)["dropout"].get<double>() > 0) {
    return Bad(source, "model.dropout", "BPE dropout is not supported");
  }
  auto set_token = [&](const std::string& s, int64_t id) -> absl::Status {
    // Ids index a dense table: bounded like GemmaConfig's vocab_size.
    if (id < 0 || id >= kMaxVocabSize) {
      return Bad(source, "model.vocab", absl::StrCat("id ", id, " of '", s, "' outside [0, ", kMaxVocabSize, ")"));
    }
    if (static_cast<int64_t>(t->id_to_token_.size()) <= id) {
      t->id_to_token_.resize(id + 1);
      t->is_special_.resize(id + 1, false);
    }
    t->id_to_token_[id] = s;
    t->vocab_[s] = id;
    return absl::OkStatus();
  };
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer()) return Bad(source, "model.vocab", absl::StrCat("'", it.key(), "' has no integer id"));
    if (auto st = set_token(it.key(), it.value().get<int64_t>()); !st.ok()) return st;
  }
  t->model_vocab_ = t->vocab_;  // BPE sees only the model's vocabulary, as in HF
  BPE_ASSIGN_OR_RETURN(t->byte_fallback_, BoolField(*model, "byte_fallback", false, source, "model"));
  BPE_ASSIGN_OR_RETURN(t->fuse_unk_, BoolField(*model, "fuse_unk", false, source, "model"));
  BPE_ASSIGN_OR_RETURN(t->ignore_merges_, BoolField(*model, "ignore_merges", false, source, "model"));
  if (auto u = model->find("unk_token"); u != model->end() && u->is_string()) {
    auto f = t->vocab_.find(u->get<std::string>());
    if (f == t->vocab_.end()) return Bad(source, "model.unk_token", "not in the vocabulary");
    t->unk_id_ = f->second;
  }
  if (auto m = model->find("merges"); m != model->end()) {
    if (!m->is_array()) return Bad(source, "model.merges", "not a list");
    int32_t rank = 0;
    for (const auto& e : *m) {
      std::string a, b;
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos) return Bad(source, "model.merges", absl::StrCat("merge '", s, "' has no space"));
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      } else {
        return Bad(source, "model.merges", "entries must be \"a b\" strings or [a, b] pairs");
      }
      auto ia = t->vocab_.find(a), ib = t->vocab_.find(b), iab = t->vocab_.find(a + b);
      if (ia == t->vocab_.end() || ib == t->vocab_.end() || iab == t->vocab_.end()) {
        return Bad(source, "model.merges", absl::StrCat("merge '", a, " ", b, "' uses tokens outside the vocabulary"));
      }
      const uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint64_t>(ib->second);
      // A repeated merge takes its last rank (HF collects the list into a map).
      t->merges_.insert_or_assign(key, BpeMerge{rank++, iab->second});
    }
  }
  if (auto a = tok.find("added_tokens"); a != tok.end() && a->is_array()) {
    for (const auto& e : *a) {
      if (!e.is_object() || !e.contains("id") || !e.contains("content") || !e["content"].is_string() ||
          !e["id"].is_number_integer()) {
        return Bad(source, "added_tokens", "entry needs an integer id and a string content");
      }
      Added added;
      added.content = e["content"].get<std::string>();
      added.id = e["id"].get<int64_t>();
      // HF AddedToken defaults: not special, normalized unless special.
      BPE_ASSIGN_OR_RETURN(added.special, BoolField(e, "special", false, source, "added_tokens"));
      BPE_ASSIGN_OR_RETURN(added.normalized, BoolField(e, "normalized", !added.special, source, "added_tokens"));
      BPE_ASSIGN_OR_RETURN(added.lstrip, BoolField(e, "lstrip", false, source, "added_tokens"));
      BPE_ASSIGN_OR_RETURN(added.rstrip, BoolField(e, "rstrip", false, source, "added_tokens"));
      BPE_ASSIGN_OR_RETURN(added.single_word, BoolField(e, "single_word", false, source, "added_tokens"));
      if (added.content.empty()) return Bad(source, "added_tokens", "empty content");
      if (auto st = set_token(added.content, added.id); !st.ok()) return st;
      t->is_special_[added.id] = added.special;
      t->added_.push_back(std::move(added));
    }
  }
  for (int b = 0; b < 256; ++b) {
    auto f = t->model_vocab_.find(absl::StrFormat("<0x%02X>", b));
    t->byte_ids_[b] = f == t->model_vocab_.end() ? -1 : f->second;
  }

  std::vector<json> steps;
  if (auto st = ParseSteps(tok.value("normalizer", json()), source, "normalizer", {"Replace", "Prepend"}, &steps); !st.ok()) return st;
  for (const auto& s : steps) {
    Step step;
    step.kind = StringField(s, "type");
    if (step.kind == "Replace") {
      auto p = PatternString(s, source, "normalizer");
      if (!p.ok()) return p.status();
      step.a = *p;
      step.b = StringField(s, "content");
    } else {
      step.a = StringField(s, "prepend");
    }
    t->normalizer_.push_back(step);
  }
  steps.clear();
  if (auto st = ParseSteps(tok.value("pre_tokenizer", json()), source, "pre_tokenizer", {"Split", "Metaspace"}, &steps); !st.ok()) return st;
  for (const auto& s : steps) {
    Step step;
    step.kind = StringField(s, "type");
    if (step.kind == "Split") {
      auto p = PatternString(s, source, "pre_tokenizer");
      if (!p.ok()) return p.status();
      step.a = *p;
      step.b = StringField(s, "behavior");
      bool invert = false;
      BPE_ASSIGN_OR_RETURN(invert, BoolField(s, "invert", false, source, "pre_tokenizer"));
      if (invert) return Bad(source, "pre_tokenizer", "Split invert is not supported");
      static const char* kBehaviors[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext"};
      if (std::none_of(std::begin(kBehaviors), std::end(kBehaviors), [&](const char* b) { return step.b == b; })) {
        return Bad(source, "pre_tokenizer", absl::StrCat("unsupported Split behavior '", step.b, "'"));
      }
    } else {
      bool add_prefix_space = true;
      BPE_ASSIGN_OR_RETURN(add_prefix_space, BoolField(s, "add_prefix_space", true, source, "pre_tokenizer"));
      step.a = s.contains("replacement") ? StringField(s, "replacement") : std::string(kMetaspace);
      step.b = s.contains("prepend_scheme") ? StringField(s, "prepend_scheme") : (add_prefix_space ? "always" : "never");
      BPE_ASSIGN_OR_RETURN(step.flag, BoolField(s, "split", true, source, "pre_tokenizer"));
    }
    t->pre_tokenizer_.push_back(step);
  }
  steps.clear();
  if (auto st = ParseSteps(tok.value("decoder", json()), source, "decoder",
                           {"Replace", "ByteFallback", "Fuse", "Strip", "Metaspace"}, &steps);
      !st.ok()) {
    return st;
  }
  for (const auto& s : steps) {
    Step step;
    step.kind = StringField(s, "type");
    if (step.kind == "Replace") {
      auto p = PatternString(s, source, "decoder");
      if (!p.ok()) return p.status();
      step.a = *p;
      step.b = StringField(s, "content");
    } else if (step.kind == "Strip") {
      step.a = StringField(s, "content");
      BPE_ASSIGN_OR_RETURN(step.start, IntField(s, "start", 0, source, "decoder"));
      BPE_ASSIGN_OR_RETURN(step.stop, IntField(s, "stop", 0, source, "decoder"));
    } else if (step.kind == "Metaspace") {
      bool add_prefix_space = true;
      BPE_ASSIGN_OR_RETURN(add_prefix_space, BoolField(s, "add_prefix_space", true, source, "decoder"));
      step.a = s.contains("replacement") ? StringField(s, "replacement") : std::string(kMetaspace);
      step.b = s.contains("prepend_scheme") ? StringField(s, "prepend_scheme") : (add_prefix_space ? "always" : "never");
    }
    t->decoder_.push_back(step);
  }

  // Added-token matchers; normalized tokens match their normalized content.
  t->raw_added_.assign(256, {});
  t->normalized_added_.assign(256, {});
  for (Added& a : t->added_) a.pattern = a.normalized ? t->Normalize(a.content) : a.content;
  std::vector<int> order(t->added_.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int>(k);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
    return t->added_[x].pattern.size() > t->added_[y].pattern.size();
  });
  for (int k : order) {
    const Added& a = t->added_[k];
    if (a.pattern.empty()) continue;
    (a.normalized ? t->normalized_added_ : t->raw_added_)[static_cast<unsigned char>(a.pattern[0])].push_back(k);
  }

  // Special ids: tokenizer_config.json names, else Gemma's fixed strings.
  auto resolve = [&](const char* key, const char* fallback, int64_t* out) {
    std::string s = config.is_object() && config.contains(key) ? TokenString(config[key]) : "";
    if (s.empty()) s = fallback;
    if (auto f = t->vocab_.find(s); f != t->vocab_.end()) *out = f->second;
  };
  resolve("pad_token", "<pad>", &t->pad_id_);
  resolve("bos_token", "<bos>", &t->bos_id_);
  resolve("eos_token", "<eos>", &t->eos_id_);
  if (add_bos.has_value()) {
    t->add_bos_ = *add_bos;
  } else if (config.is_object() && config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
    t->add_bos_ = config["add_bos_token"].get<bool>();
  } else if (auto pp = tok.find("post_processor"); pp != tok.end() && pp->is_object() &&
                                                     StringField(*pp, "type") == "TemplateProcessing" &&
                                                     pp->contains("single") && (*pp)["single"].is_array() &&
                                                     !(*pp)["single"].empty()) {
    t->add_bos_ = (*pp)["single"][0].contains("SpecialToken");
  }
  t->cuts_ = std::make_unique<BpeCutChecker>(t->merges_, t->id_to_token_);
  return t;
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromFiles(const std::string& tokenizer_json,
                                                                       const std::string& tokenizer_config_json,
                                                                       std::optional<bool> add_bos) {
  std::ifstream in(tokenizer_json);
  if (!in) return absl::NotFoundError(absl::StrCat(tokenizer_json, ": cannot open"));
  json tok = json::parse(in, nullptr, false);
  if (tok.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(tokenizer_json, ": invalid JSON"));
  json config;
  if (!tokenizer_config_json.empty()) {
    std::ifstream cin(tokenizer_config_json);
    if (cin) {
      config = json::parse(cin, nullptr, false);
      if (config.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(tokenizer_config_json, ": invalid JSON"));
    }
  }
  return FromJson(tok, config, tokenizer_json, add_bos);
}

std::optional<int64_t> BpeTokenizer::TokenToId(absl::string_view token) const {
  auto f = vocab_.find(std::string(token));
  if (f == vocab_.end()) return std::nullopt;
  return f->second;
}

const std::string& BpeTokenizer::IdToToken(int64_t id) const {
  static const std::string* const kEmpty = new std::string();
  return id >= 0 && id < vocab_size() ? id_to_token_[id] : *kEmpty;
}

std::string BpeTokenizer::Normalize(absl::string_view text) const {
  std::string s(text);
  for (const Step& step : normalizer_) {
    if (step.kind == "Replace") {
      s = ReplaceAll(s, step.a, step.b);
    } else if (step.kind == "Prepend" && !s.empty()) {
      s = step.a + s;
    }
  }
  return s;
}

std::vector<std::string> BpeTokenizer::PreTokenize(const std::string& text, bool at_start) const {
  std::vector<std::string> pieces = {text};
  for (const Step& step : pre_tokenizer_) {
    std::vector<std::string> next;
    for (const std::string& p : pieces) {
      std::string s = p;
      std::string pattern = step.a;
      std::string behavior = step.b;
      if (step.kind == "Metaspace") {
        s = ReplaceAll(s, " ", step.a);
        const bool prepend = step.b == "always" || (step.b == "first" && at_start);
        if (prepend && s.compare(0, step.a.size(), step.a) != 0) s = step.a + s;
        if (!step.flag) {
          next.push_back(s);
          continue;
        }
        behavior = "MergedWithNext";
      }
      // Split `s` at occurrences of `pattern` according to `behavior`.
      std::string cur;
      size_t i = 0;
      while (i < s.size()) {
        size_t j = pattern.empty() ? std::string::npos : s.find(pattern, i);
        if (j == std::string::npos) {
          cur += s.substr(i);
          break;
        }
        std::string before = s.substr(i, j - i);
        if (behavior == "MergedWithPrevious") {
          next.push_back(cur + before + pattern);
          cur.clear();
        } else if (behavior == "MergedWithNext") {
          if (!(cur + before).empty()) next.push_back(cur + before);
          cur = pattern;
        } else {
          if (!(cur + before).empty()) next.push_back(cur + before);
          cur.clear();
          if (behavior == "Isolated") next.push_back(pattern);
        }
        i = j + pattern.size();
      }
      if (!cur.empty()) next.push_back(cur);
    }
    pieces.swap(next);
  }
  return pieces;
}

void BpeTokenizer::AppendSymbols(absl::string_view piece, size_t count, size_t* pos,
                                 std::vector<int64_t>* symbols) const {
  while (*pos < piece.size() && symbols->size() < count) {
    size_t n = Utf8CharLen(static_cast<unsigned char>(piece[*pos]));
    if (*pos + n > piece.size()) n = 1;
    const absl::string_view ch = piece.substr(*pos, n);
    *pos += n;
    auto push = [&](int64_t id) {
      if (id == unk_id_ && fuse_unk_ && !symbols->empty() && symbols->back() == unk_id_) return;
      symbols->push_back(id);
    };
    auto f = model_vocab_.find(std::string(ch));
    if (f != model_vocab_.end()) {
      push(f->second);
      continue;
    }
    bool all_bytes = byte_fallback_;
    for (unsigned char c : ch) all_bytes = all_bytes && byte_ids_[c] >= 0;
    if (all_bytes) {
      for (unsigned char c : ch) push(byte_ids_[c]);
    } else if (unk_id_ >= 0) {
      push(unk_id_);
    }
  }
}

void BpeTokenizer::EncodePiece(absl::string_view piece, std::vector<int64_t>* out, int64_t limit) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (auto f = model_vocab_.find(std::string(piece)); f != model_vocab_.end()) {
      out->push_back(f->second);
      return;
    }
  }
  std::vector<int64_t> syms;
  size_t pos = 0;
  if (limit >= 0 && cuts_->enabled()) {
    // Merge only a head that ends at a provable cut (bpe_merge.h); double it
    // while it yields fewer than `limit` tokens.
    const size_t lookahead = cuts_->max_bytes();  // every symbol's string has >= 1 byte
    for (size_t head = 2 * static_cast<size_t>(limit) + 64;; head *= 2) {
      AppendSymbols(piece, head + kMaxCutSearch + lookahead, &pos, &syms);
      if (pos == piece.size()) break;  // the whole piece is at hand
      size_t cut = 0;
      for (size_t p = std::max<size_t>(head, 1); p < head + kMaxCutSearch; ++p) {
        if (cuts_->IsCut(syms, p, id_to_token_)) {
          cut = p;
          break;
        }
      }
      if (cut == 0) break;  // no provable cut: merge the whole piece
      std::vector<int64_t> tokens;
      ApplyBpeMerges(absl::MakeConstSpan(syms).first(cut), merges_, &tokens);
      if (static_cast<int64_t>(tokens.size()) >= limit) {
        out->insert(out->end(), tokens.begin(), tokens.end());
        return;
      }
    }
  }
  AppendSymbols(piece, std::numeric_limits<size_t>::max(), &pos, &syms);
  ApplyBpeMerges(syms, merges_, out);
}

std::vector<BpeTokenizer::Segment> BpeTokenizer::SplitAdded(absl::string_view text, const AddedIndex& index) const {
  std::vector<Segment> out;
  const size_t n = text.size();
  size_t start_offset = 0;  // end of the previous emitted token
  size_t pos = 0;           // scan position (after the previous match, kept or not)
  while (pos < n) {
    const Added* hit = nullptr;
    for (int k : index[static_cast<unsigned char>(text[pos])]) {  // longest first
      const Added& a = added_[k];
      if (text.compare(pos, a.pattern.size(), a.pattern) == 0) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + hit->pattern.size();
    pos = stop;
    if (hit->single_word) {
      const bool word_before = start > 0 && IsWordChar(LastCodePoint(text.substr(0, start)));
      size_t len;
      const bool word_after = stop < n && IsWordChar(DecodeUtf8At(text, stop, &len));
      if (word_before || word_after) continue;  // discarded; the scan still moves past it
    }
    if (hit->lstrip) {
      size_t s = start;
      while (s > start_offset) {
        size_t back = s - 1;
        while (back > 0 && (static_cast<unsigned char>(text[back]) & 0xc0) == 0x80) --back;
        size_t len;
        if (!IsUnicodeWhitespace(DecodeUtf8At(text, back, &len))) break;
        s = back;
      }
      start = s;
    }
    if (hit->rstrip) {
      size_t len;
      while (stop < n && IsUnicodeWhitespace(DecodeUtf8At(text, stop, &len))) stop += len;
      pos = stop;
    }
    if (start_offset < start) out.push_back(Segment{-1, start_offset, start});
    out.push_back(Segment{hit->id, start, stop});
    start_offset = stop;
  }
  if (start_offset < n) out.push_back(Segment{-1, start_offset, n});
  return out;
}

std::vector<int64_t> BpeTokenizer::Encode(absl::string_view input, std::optional<bool> add_bos) const {
  return EncodeUpTo(input, add_bos, -1);
}

std::vector<int64_t> BpeTokenizer::EncodeHead(absl::string_view input, int64_t max_tokens,
                                              std::optional<bool> add_bos) const {
  std::vector<int64_t> ids = EncodeUpTo(input, add_bos, max_tokens);
  if (static_cast<int64_t>(ids.size()) > max_tokens) ids.resize(static_cast<size_t>(max_tokens));
  return ids;
}

std::vector<int64_t> BpeTokenizer::EncodeUpTo(absl::string_view input, std::optional<bool> add_bos,
                                              int64_t limit) const {
  std::vector<int64_t> ids;
  if (add_bos.value_or(add_bos_) && bos_id_ >= 0) ids.push_back(bos_id_);
  auto done = [&] { return limit >= 0 && static_cast<int64_t>(ids.size()) >= limit; };
  const std::string text = SanitizeUtf8(input);
  for (const Segment& raw : SplitAdded(text, raw_added_)) {
    if (done()) break;
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    const std::string normalized = Normalize(absl::string_view(text).substr(raw.begin, raw.end - raw.begin));
    for (const Segment& piece : SplitAdded(normalized, normalized_added_)) {
      if (done()) break;
      if (piece.id >= 0) {
        ids.push_back(piece.id);
        continue;
      }
      // Metaspace's prepend_scheme "first": only a piece at offset 0 of the input.
      const bool at_start = raw.begin == 0 && piece.begin == 0;
      for (const std::string& word : PreTokenize(normalized.substr(piece.begin, piece.end - piece.begin), at_start)) {
        if (done()) break;
        EncodePiece(word, &ids, limit < 0 ? -1 : limit - static_cast<int64_t>(ids.size()));
      }
    }
  }
  return ids;
}

std::string BpeTokenizer::Decode(absl::Span<const int64_t> ids, bool skip_special) const {
  std::vector<std::string> toks;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special && is_special_[id]) continue;
    toks.push_back(id_to_token_[id]);
  }
  for (const Step& step : decoder_) {
    if (step.kind == "Replace") {
      for (auto& t : toks) t = ReplaceAll(t, step.a, step.b);
    } else if (step.kind == "Fuse") {
      std::string all;
      for (const auto& t : toks) all += t;
      toks = {all};
    } else if (step.kind == "Strip") {
      for (auto& t : toks) {
        for (int64_t k = 0; k < step.start && t.compare(0, step.a.size(), step.a) == 0 && !step.a.empty(); ++k) {
          t.erase(0, step.a.size());
        }
        for (int64_t k = 0; k < step.stop && t.size() >= step.a.size() && !step.a.empty() &&
                            t.compare(t.size() - step.a.size(), step.a.size(), step.a) == 0;
             ++k) {
          t.erase(t.size() - step.a.size());
        }
      }
    } else if (step.kind == "Metaspace") {
      for (size_t k = 0; k < toks.size(); ++k) {
        toks[k] = ReplaceAll(toks[k], step.a, " ");
        if (k == 0 && step.b != "never" && !toks[k].empty() && toks[k][0] == ' ') toks[k].erase(0, 1);
      }
    } else if (step.kind == "ByteFallback") {
      // Runs of <0xNN> tokens become their bytes when valid UTF-8, else one
      // U+FFFD per byte of the run (HF semantics).
      std::vector<std::string> outv;
      std::string bytes;
      int nbytes = 0;
      auto flush = [&] {
        if (nbytes == 0) return;
        // Strict UTF-8 (Rust's String::from_utf8: no overlongs, surrogates
        // or code points past U+10FFFF).
        if (SanitizeUtf8(bytes) == bytes) {
          outv.push_back(bytes);
        } else {
          for (int q = 0; q < nbytes; ++q) outv.push_back("\xef\xbf\xbd");
        }
        bytes.clear();
        nbytes = 0;
      };
      for (const auto& t : toks) {
        unsigned int b;
        if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::sscanf(t.c_str(), "<0x%2X>", &b) == 1) {
          bytes.push_back(static_cast<char>(b));
          ++nbytes;
        } else {
          flush();
          outv.push_back(t);
        }
      }
      flush();
      toks.swap(outv);
    }
  }
  std::string out;
  for (const auto& t : toks) out += t;
  return out;
}

}  // namespace tpudist::models::gemma
