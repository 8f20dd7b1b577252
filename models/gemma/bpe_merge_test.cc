// EncodeHead(text, n) == Encode(text)[:n]: on the bundled tokenizer over the
// bundled data, on random tokenizers whose merges cascade, and on a 10 MB
// example, which must take a linear scan rather than a full BPE merge.
#include "models/gemma/bpe_merge.h"

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/gemma/bpe_tokenizer.h"
#include "models/gemma/model_dir.h"
#include "models/gemma/tokenizer.h"
#include "models/gemma/utf8.h"
#include "testing/source_dir.h"

namespace tpudist::models::gemma {
namespace {

using nlohmann::json;

using test_support::SourceDir;

std::vector<int64_t> Head(std::vector<int64_t> ids, int64_t n) {
  if (static_cast<int64_t>(ids.size()) > n) ids.resize(n);
  return ids;
}

// The seed's prompts of data/instructions/train.jsonl.
std::vector<std::string> BundledPrompts() {
  std::ifstream in(SourceDir() + "/data/instructions/train.jsonl");
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const json r = json::parse(line);
    out.push_back("Instruction: " + r["instruction"].get<std::string>() +
                  "\nResponse: " + r["response"].get<std::string>());
  }
  return out;
}

TEST(BpeMerge, CutCheckerNeedsConsistentStrings) {
  const std::vector<std::string> strs = {"a", "b", "ab", "ba"};
  BpeMergeMap merges = {{BpeMergeKey(0, 1), {0, 2}}};  // a + b -> ab
  BpeCutChecker ok(merges, strs);
  ASSERT_TRUE(ok.enabled());
  EXPECT_EQ(ok.max_bytes(), 2u);
  const std::vector<int64_t> syms = {1, 0, 0, 1, 1};  // b a a b b
  EXPECT_TRUE(ok.IsCut(syms, 1, strs));   // b|a
  EXPECT_TRUE(ok.IsCut(syms, 2, strs));   // a|a
  EXPECT_FALSE(ok.IsCut(syms, 3, strs));  // a|b could merge
  EXPECT_TRUE(ok.IsCut(syms, 4, strs));   // b|b
  BpeMergeMap bad = {{BpeMergeKey(0, 1), {0, 3}}};  // a + b -> "ba"?
  EXPECT_FALSE(BpeCutChecker(bad, strs).enabled());
  EXPECT_FALSE(BpeCutChecker({}, strs).enabled());
}

TEST(EncodeHead, BundledTokenizerOnBundledData) {
  auto tok = LoadTokenizer(SourceDir() + "/data/tiny_gemma");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<std::string> prompts = BundledPrompts();
  ASSERT_GT(prompts.size(), 1000u);
  // Long texts (many rows joined) so that the head logic has room to cut.
  std::string all;
  for (const std::string& p : prompts) all += p + "\n\n";
  for (size_t start : {size_t{0}, all.size() / 3, all.size() / 2}) {
    const std::string text = all.substr(start, 40000);
    const std::vector<int64_t> full = (*tok)->Encode(text, false);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 100, 511, 512, 513, 1000, 4000}) {
      ASSERT_EQ((*tok)->EncodeHead(text, n, false), Head(full, n)) << "start " << start << " n " << n;
    }
  }
  int64_t rows = 0;
  for (const std::string& p : prompts) {
    const std::vector<int64_t> full = (*tok)->Encode(p, false);
    for (int64_t n : {1, 5, 40, 513}) ASSERT_EQ((*tok)->EncodeHead(p, n, false), Head(full, n)) << p;
    ASSERT_EQ((*tok)->EncodeHead(p, 513, true), Head((*tok)->Encode(p, true), 513)) << p;
    ++rows;
  }
  EXPECT_EQ(rows, static_cast<int64_t>(prompts.size()));
}

// A Gemma-style tokenizer.json (Replace " " -> "▁", one word per text) with
// random merges over a small alphabet, so that merges chain and compete.
json RandomTokenizer(uint32_t seed, bool byte_fallback) {
  std::mt19937 rng(seed);
  const std::string ms(kMetaspace);
  std::vector<std::string> tokens = {"<pad>", "<eos>", "<bos>", "<unk>"};
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    tokens.push_back(buf);
  }
  const std::vector<std::string> chars = {"a", "b", "c", ms, "x"};  // "x" never merges
  const size_t first_char = tokens.size();
  tokens.insert(tokens.end(), chars.begin(), chars.end());
  json merges = json::array();
  std::set<std::string> seen(tokens.begin(), tokens.end());
  while (merges.size() < 40) {
    const std::string& a = tokens[first_char + rng() % (tokens.size() - first_char)];
    const std::string& b = tokens[first_char + rng() % (tokens.size() - first_char)];
    if (a == "x" || b == "x" || a.size() + b.size() > 12 || seen.count(a + b)) continue;
    merges.push_back(a + " " + b);
    seen.insert(a + b);
    tokens.push_back(a + b);
  }
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  json added = json::array();
  for (int i = 0; i < 4; ++i) added.push_back({{"id", i}, {"content", tokens[i]}, {"special", true}, {"normalized", false}});
  return json{{"added_tokens", added},
              {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", ms}}},
              {"pre_tokenizer", nullptr},
              {"decoder", nullptr},
              {"model",
               {{"type", "BPE"}, {"unk_token", "<unk>"}, {"byte_fallback", byte_fallback}, {"fuse_unk", true},
                {"vocab", vocab}, {"merges", merges}}}};
}

TEST(EncodeHead, RandomCascadingMergesGiveTheSameHead) {
  const std::vector<std::string> alphabet = {"a", "b", "c", " ", "a", "b", "x", "\xc3\xa9", "z"};
  int64_t checked = 0;
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    auto tok = BpeTokenizer::FromJson(RandomTokenizer(seed, seed % 2 == 0), json(), "random", false);
    ASSERT_TRUE(tok.ok()) << tok.status();
    std::mt19937 rng(seed * 7919);
    for (int t = 0; t < 4; ++t) {
      std::string text;
      const size_t len = 1500 + rng() % 3000;
      // Some texts are long runs of one letter: cuts there are rare.
      const bool runs = t == 3;
      while (text.size() < len) text += alphabet[(runs ? rng() % 2 : rng() % alphabet.size())];
      const std::vector<int64_t> full = (*tok)->Encode(text);
      for (int64_t n : {1, 2, 3, 10, 50, 200, 700, 2000}) {
        ASSERT_EQ((*tok)->EncodeHead(text, n), Head(full, n)) << "seed " << seed << " n " << n << ": " << text;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 12 * 4 * 8);
}

// The fault-injection case: one 10 MB example, of which the fine-tune keeps
// max_seq_len + 1 ids. EncodeHead must give the whole text's first ids and
// cost a small fraction of encoding it whole (~4.5 s here; 48 s reported).
TEST(EncodeHead, TenMegabyteExampleIsQuickAndIdentical) {
  auto tok = LoadTokenizer(SourceDir() + "/data/tiny_gemma");
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::string text;
  for (const std::string& p : BundledPrompts()) text += p + " ";
  const std::string one_pass = text;
  while (text.size() < (10u << 20)) text += one_pass;
  text.resize(10u << 20);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const std::vector<int64_t> head = (*tok)->EncodeHead(text, 513, false);
  const auto t1 = Clock::now();
  const std::vector<int64_t> full = (*tok)->Encode(text, false);
  const auto t2 = Clock::now();
  const double head_s = std::chrono::duration<double>(t1 - t0).count();
  const double full_s = std::chrono::duration<double>(t2 - t1).count();
  ASSERT_EQ(head.size(), 513u);
  EXPECT_EQ(head, Head(full, 513));
  // Both timed under the same load: the head must be far cheaper.
  EXPECT_LT(head_s * 5, full_s) << "EncodeHead " << head_s << " s, Encode " << full_s << " s";
  std::cout << "[ head ] 513 ids of a 10 MB example: EncodeHead " << head_s << " s, Encode " << full_s
            << " s\n";
}

}  // namespace
}  // namespace tpudist::models::gemma
