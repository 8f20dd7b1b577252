#include <filesystem>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "models/gemma/bpe_tokenizer.h"
#include "models/gemma/bpe_trainer.h"
#include "models/gemma/model_dir.h"
#include "testing/files.h"
#include "testing/temp_dir.h"
#include "models/gemma/sentencepiece_tokenizer.h"
#include "models/gemma/tokenizer.h"
#include "models/gemma/utf8.h"

namespace tpudist::models::gemma {
namespace {

using nlohmann::json;
const std::string kMs(kMetaspace);

// A hand-made Gemma-style tokenizer.json with known merges.
json HandTokenizer(bool merges_as_strings) {
  json vocab = {{"<pad>", 0}, {"<eos>", 1}, {"<bos>", 2}, {"<unk>", 3}};
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    vocab[buf] = 4 + b;
  }
  const std::vector<std::string> chars = {kMs, "h", "e", "l", "o", "w", "r", "d"};
  for (size_t i = 0; i < chars.size(); ++i) vocab[chars[i]] = 260 + i;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {kMs, "w"}, {"he", "ll"}, {"hell", "o"}, {"o", "r"}, {kMs + "w", "or"}};
  json m = json::array();
  int id = 268;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = id++;
    m.push_back(merges_as_strings ? json(a + " " + b) : json::array({a, b}));
  }
  json added = json::array();
  for (auto [s, i] : std::vector<std::pair<std::string, int>>{{"<pad>", 0}, {"<eos>", 1}, {"<bos>", 2}, {"<unk>", 3}}) {
    added.push_back({{"id", i}, {"content", s}, {"special", true}, {"normalized", false}});
  }
  added.push_back({{"id", 275}, {"content", "<start_of_turn>"}, {"special", true}, {"normalized", false}});
  return json{
      {"added_tokens", added},
      {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMs}}},
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", {{{"type", "Replace"}, {"pattern", {{"String", kMs}}}, {"content", " "}}, {{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}},
      {"model",
       {{"type", "BPE"}, {"unk_token", "<unk>"}, {"byte_fallback", true}, {"fuse_unk", true}, {"vocab", vocab}, {"merges", m}}}};
}

std::unique_ptr<BpeTokenizer> Load(const json& j, const json& config = json(), std::optional<bool> bos = std::nullopt) {
  auto t = BpeTokenizer::FromJson(j, config, "tokenizer.json", bos);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

TEST(BpeTokenizer, EncodesWithMergeRanks) {
  for (bool as_strings : {false, true}) {
    auto t = Load(HandTokenizer(as_strings));
    ASSERT_NE(t, nullptr);
    // hello world -> "hello" "▁wor" "l" "d" (hand-applied merge order).
    EXPECT_EQ(t->Encode("hello world"), (std::vector<int64_t>{272, 274, 263, 267}));
    EXPECT_EQ(t->Decode({272, 274, 263, 267}), "hello world");
    EXPECT_EQ(t->IdToToken(274), kMs + "wor");
  }
}

TEST(BpeTokenizer, ByteFallbackAndDecodeOfBytes) {
  auto t = Load(HandTokenizer(false));
  // é = C3 A9 is not in the vocabulary -> <0xC3> <0xA9>.
  EXPECT_EQ(t->Encode("h\xc3\xa9"), (std::vector<int64_t>{261, 4 + 0xC3, 4 + 0xA9}));
  EXPECT_EQ(t->Decode({261, 4 + 0xC3, 4 + 0xA9}), "h\xc3\xa9");
  EXPECT_EQ(t->Decode({261, 4 + 0xC3}), "h\xef\xbf\xbd");  // lone lead byte -> U+FFFD
  const std::string text = "wow d\xc3\xa9j\xc3\xa0 vu \xf0\x9f\x98\x80 hello";
  EXPECT_EQ(t->Decode(t->Encode(text)), text);
}

TEST(BpeTokenizer, AddedTokensMatchedBeforeBpeAndSpecialsSkipped) {
  auto t = Load(HandTokenizer(false), json{{"add_bos_token", true}});
  EXPECT_TRUE(t->add_bos());
  EXPECT_EQ(t->Encode("<start_of_turn>hello<eos>"), (std::vector<int64_t>{2, 275, 272, 1}));
  EXPECT_EQ(t->Encode("hello", false), (std::vector<int64_t>{272}));
  // HF's decode keeps special tokens unless skip_special_tokens=True.
  EXPECT_EQ(t->Decode({2, 272, 1}), "<bos>hello<eos>");
  EXPECT_EQ(t->Decode({2, 272, 1}, /*skip_special=*/true), "hello");
  EXPECT_EQ(t->Decode({2, 272, 1}, /*skip_special=*/false), "<bos>hello<eos>");
  EXPECT_EQ(t->pad_id(), 0);
  EXPECT_EQ(t->eos_id(), 1);
  EXPECT_EQ(t->bos_id(), 2);
  EXPECT_EQ(*t->TokenToId("<start_of_turn>"), 275);
  EXPECT_EQ(t->vocab_size(), 276);
  // Flag overrides tokenizer_config.json; default without config is no BOS.
  EXPECT_FALSE(Load(HandTokenizer(false), json{{"add_bos_token", true}}, false)->add_bos());
  EXPECT_FALSE(Load(HandTokenizer(false))->add_bos());
}

TEST(BpeTokenizer, MetaspacePreTokenizer) {
  json j = HandTokenizer(false);
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kMs}, {"prepend_scheme", "always"}, {"split", true}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Metaspace"}, {"replacement", kMs}, {"prepend_scheme", "always"}}, {{"type", "Fuse"}}}}};
  auto t = Load(j);
  EXPECT_EQ(t->Encode("hello world"), (std::vector<int64_t>{260, 272, 274, 263, 267}));
  EXPECT_EQ(t->Decode({260, 272, 274, 263, 267}), "hello world");
}

TEST(BpeTokenizer, LoadErrorsNameTheField) {
  json j = HandTokenizer(false);
  j["model"]["type"] = "WordPiece";
  auto st = BpeTokenizer::FromJson(j, json(), "/d/tokenizer.json").status();
  EXPECT_NE(st.message().find("/d/tokenizer.json"), std::string::npos) << st;
  EXPECT_NE(st.message().find("model.type"), std::string::npos) << st;
  j = HandTokenizer(false);
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_NE(BpeTokenizer::FromJson(j, json(), "t").status().message().find("normalizer"), std::string::npos);
  j = HandTokenizer(false);
  j["model"]["merges"].push_back(json::array({"x", "y"}));
  EXPECT_NE(BpeTokenizer::FromJson(j, json(), "t").status().message().find("model.merges"), std::string::npos);
  j = HandTokenizer(false);
  j["model"].erase("vocab");
  EXPECT_NE(BpeTokenizer::FromJson(j, json(), "t").status().message().find("model.vocab"), std::string::npos);
  j = HandTokenizer(false);
  j["pre_tokenizer"]["pattern"] = {{"Regex", "\\s+"}};
  EXPECT_FALSE(BpeTokenizer::FromJson(j, json(), "t").ok());
}

// Oracle: the textbook O(n^2) BPE (apply the lowest-rank merge, leftmost
// first, until none applies), written independently of the heap version.
std::vector<std::string> NaiveBpe(const std::string& word, const std::map<std::pair<std::string, std::string>, int>& rank) {
  std::vector<std::string> s;
  for (auto c : SplitUtf8(word)) s.emplace_back(c);
  while (true) {
    int best = -1, best_rank = 1 << 30;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      auto it = rank.find({s[i], s[i + 1]});
      if (it != rank.end() && it->second < best_rank) {
        best_rank = it->second;
        best = static_cast<int>(i);
      }
    }
    if (best < 0) return s;
    s[best] += s[best + 1];
    s.erase(s.begin() + best + 1);
  }
}

const char* kCorpus =
    "the cat sat on the mat\nthe dog ate the bone\nthe cat and the dog are friends\n"
    "a model learns from the data\nthe data is small and the model is tiny\n"
    "write a short answer to the question\nthe answer is yes\n";

TEST(BpeTrainer, TrainsGemmaStyleTokenizerThatRoundTrips) {
  BpeTrainerOptions opt;
  opt.vocab_size = 330;
  auto model = TrainBpe(kCorpus, opt);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(static_cast<int64_t>(model->vocab.size()), 330);
  EXPECT_EQ(model->vocab[0], "<pad>");
  EXPECT_EQ(model->vocab[2], "<bos>");
  EXPECT_EQ(model->vocab[4], "<0x00>");
  auto t = Load(BpeTokenizerJson(*model));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 330);
  // The most frequent word becomes one token.
  EXPECT_EQ(t->Encode(" the"), (std::vector<int64_t>{*t->TokenToId(kMs + "the")}));
  for (const std::string& text : {std::string("the cat sat on the mat"), std::string("Unseen W\xc3\xb6rds & symbols: 42!\n"),
                                 std::string("  double  spaces ")}) {
    EXPECT_EQ(t->Decode(t->Encode(text)), text);
  }
  // Heap BPE equals the naive oracle on random mixes of corpus words.
  std::map<std::pair<std::string, std::string>, int> rank;
  for (size_t i = 0; i < model->merges.size(); ++i) rank[model->merges[i]] = static_cast<int>(i);
  std::mt19937 rng(1);
  const std::vector<std::string> words = {"the", "cat", "data", "model", "answer", "tiny", "ate", "friends", "quest"};
  for (int trial = 0; trial < 50; ++trial) {
    std::string text;
    for (int k = 0; k < 6; ++k) text += (rng() % 3 ? " " : "") + words[rng() % words.size()];
    std::vector<int64_t> want;
    for (const auto& tok : NaiveBpe(ReplaceAll(text, " ", kMs), rank)) want.push_back(*t->TokenToId(tok));
    EXPECT_EQ(t->Encode(text), want) << text;
  }
  opt.vocab_size = 100;  // cannot hold specials + bytes
  EXPECT_FALSE(TrainBpe(kCorpus, opt).ok());
}

TEST(Tokenizer, LoadTokenizerPicksJsonThenSentencePiece) {
  test_support::ScopedTempDir dir("gemma_test");
  EXPECT_EQ(LoadTokenizer(dir.path()).status().code(), absl::StatusCode::kNotFound);
  test_support::WriteFile(dir / "tokenizer.json", HandTokenizer(false).dump());
  test_support::WriteFile(dir / "tokenizer_config.json", json{{"add_bos_token", true}}.dump());
  auto t = LoadTokenizer(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Encode("hello"), (std::vector<int64_t>{2, 272}));
  test_support::WriteFile(dir / "tokenizer.json", "{broken");
  EXPECT_FALSE(LoadTokenizer(dir.path()).ok());
}

TEST(SentencePiece, TrainLoadEncodeDecode) {
  test_support::ScopedTempDir dir("gemma_test");
  std::string corpus;
  for (int i = 0; i < 20; ++i) corpus += kCorpus;
  test_support::WriteFile(dir / "corpus.txt", corpus);
  auto st = SentencePieceTokenizer::Train("--input=" + (dir / "corpus.txt") + " --model_prefix=" + (dir / "tokenizer") +
                                          " --vocab_size=60 --model_type=bpe --hard_vocab_limit=false"
                                          " --pad_id=0 --eos_id=1 --bos_id=2 --unk_id=3 --character_coverage=1.0");
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_TRUE(std::filesystem::exists(dir / "tokenizer.model"));
  auto t = LoadTokenizer(dir.path());  // no tokenizer.json: SentencePiece
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->pad_id(), 0);
  EXPECT_EQ((*t)->eos_id(), 1);
  EXPECT_EQ((*t)->bos_id(), 2);
  std::vector<int64_t> ids = (*t)->Encode("the cat ate the data");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 2);
  for (int64_t id : ids) EXPECT_LT(id, (*t)->vocab_size());
  EXPECT_LT(ids.size(), 20u);  // merges were learned
  EXPECT_EQ((*t)->Decode(ids), "the cat ate the data");
  EXPECT_EQ((*t)->Encode("the", false)[0], *(*t)->TokenToId("\xe2\x96\x81the"));
  EXPECT_FALSE(SentencePieceTokenizer::Load(dir / "corpus.txt").ok());  // not a model
  EXPECT_FALSE(SentencePieceTokenizer::Load(dir / "tokenizer.model", {}, "/nonexistent/shim.so").ok());
}

}  // namespace
}  // namespace tpudist::models::gemma
