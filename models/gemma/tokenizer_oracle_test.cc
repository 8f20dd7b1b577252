// BpeTokenizer against HF tokenizers 0.23 and transformers 5.23 (fixtures
// from tests/oracles/make_tokenizer_fixtures.py): identical ids and decodes
// (with and without skipping special tokens) on adversarial text for two
// Gemma-structured tokenizer.json files built with `tokenizers` (every
// added-token flag combination, duplicate merges, byte fallback, unk,
// post-processor BOS), a deterministic 1 MiB input, and the fine-tune data
// as the seed tokenizes it (AutoTokenizer on data/tiny_gemma).
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/gemma/bpe_tokenizer.h"
#include "models/gemma/model_dir.h"
#include "models/gemma/tokenizer.h"

#ifndef TPU_DIST_ORACLE_NO_TORCH
#include "models/gemma/gemma_model.h"
#include "io/safetensors.h"
#endif
#include "testing/source_dir.h"

namespace tpudist::models::gemma {
namespace {

using nlohmann::json;

std::string FixtureDir() {
  return test_support::SourceDir() + "/tests/oracles/fixtures/tokenizer";
}

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << path;
  return j;
}

std::string HexToBytes(const std::string& hex) { return absl::HexStringToBytes(hex); }

std::vector<int64_t> Ids(const json& j) { return j.get<std::vector<int64_t>>(); }

uint64_t FnvBytes(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

uint64_t FnvIds(const std::vector<int64_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t v : ids) h = (h ^ static_cast<uint64_t>(v)) * 0x100000001b3ull;
  return h;
}

// Escaped for failure messages.
std::string Show(const std::string& s) { return absl::StrCat("\"", absl::CHexEscape(s), "\""); }

class TokenizerOracle : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizers_ = new std::map<std::string, std::unique_ptr<BpeTokenizer>>();
    for (const char* name : {"gemma_like", "gemma_bos"}) {
      auto t = BpeTokenizer::FromFiles(FixtureDir() + "/" + name + "/tokenizer.json", "");
      ASSERT_TRUE(t.ok()) << t.status();
      (*tokenizers_)[name] = std::move(*t);
    }
  }
  static void TearDownTestSuite() {
    delete tokenizers_;
    tokenizers_ = nullptr;
  }
  static const BpeTokenizer& Tok(const std::string& name) { return *tokenizers_->at(name); }

  static std::map<std::string, std::unique_ptr<BpeTokenizer>>* tokenizers_;
};

std::map<std::string, std::unique_ptr<BpeTokenizer>>* TokenizerOracle::tokenizers_ = nullptr;

TEST_F(TokenizerOracle, AdversarialTextIdsAndDecodes) {
  const json cases = ReadJson(FixtureDir() + "/cases.json")["cases"];
  ASSERT_GT(cases.size(), 100u);
  int encoded = 0, decoded = 0;
  for (const json& c : cases) {
    const BpeTokenizer& t = Tok(c["tokenizer"].get<std::string>());
    const std::string where = absl::StrCat(c["tokenizer"].get<std::string>(), "/", c["name"].get<std::string>());
    std::vector<int64_t> ids;
    if (c.contains("input_hex")) {
      const std::string input = HexToBytes(c["input_hex"].get<std::string>());
      ids = t.Encode(input, /*add_bos=*/false);
      EXPECT_EQ(ids, Ids(c["ids"])) << where << " input " << Show(input);
      EXPECT_EQ(t.Encode(input), Ids(c["ids_with_special"])) << where << " (tokenizer's own BOS rule)";
      ++encoded;
      ids = Ids(c["ids"]);  // decode HF's ids even if ours differ
    } else {
      ids = Ids(c["decode_ids"]);
    }
    EXPECT_EQ(t.Decode(ids), c["decode"].get<std::string>()) << where << " decode, default (keeps specials)";
    EXPECT_EQ(t.Decode(ids, /*skip_special=*/false), c["decode"].get<std::string>()) << where;
    EXPECT_EQ(t.Decode(ids, /*skip_special=*/true), c["decode_skip"].get<std::string>()) << where << " skip_special";
    ++decoded;
  }
  EXPECT_GT(encoded, 80);
  EXPECT_GT(decoded, encoded);
}

TEST_F(TokenizerOracle, OneMegabyteInput) {
  const json big = ReadJson(FixtureDir() + "/big.json");
  std::vector<std::string> fragments;
  for (const json& f : big["fragments_hex"]) fragments.push_back(HexToBytes(f.get<std::string>()));
  uint64_t state = big["seed"].get<uint64_t>();
  std::string text;
  while (text.size() < big["min_bytes"].get<size_t>()) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    text += fragments[(state >> 33) % fragments.size()];
  }
  ASSERT_EQ(text.size(), big["text_bytes"].get<size_t>());
  ASSERT_EQ(absl::StrFormat("%016x", FnvBytes(text)), big["text_fnv"].get<std::string>());
  for (const auto& [name, want] : big["tokenizers"].items()) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int64_t> ids = Tok(name).Encode(text, /*add_bos=*/false);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(secs, 20.0) << name << ": 1 MiB took " << secs << " s";
    ASSERT_EQ(ids.size(), want["num_ids"].get<size_t>()) << name;
    const std::vector<int64_t> first(ids.begin(), ids.begin() + 64), last(ids.end() - 64, ids.end());
    EXPECT_EQ(first, Ids(want["first_ids"])) << name;
    EXPECT_EQ(last, Ids(want["last_ids"])) << name;
    EXPECT_EQ(absl::StrFormat("%016x", FnvIds(ids)), want["ids_fnv"].get<std::string>()) << name;
    EXPECT_EQ(absl::StrFormat("%016x", FnvBytes(Tok(name).Decode(ids, false))), want["decode_fnv"].get<std::string>())
        << name;
    EXPECT_EQ(absl::StrFormat("%016x", FnvBytes(Tok(name).Decode(ids, true))),
              want["decode_skip_fnv"].get<std::string>())
        << name;
  }
}

#ifndef TPU_DIST_ORACLE_NO_TORCH
// The seed: AutoTokenizer(data/tiny_gemma)(f"Instruction: {i}\nResponse: {r}",
// truncation=True, max_length=512, padding="max_length") +
// DataCollatorForLanguageModeling(mlm=False). Our tokenizer must give the same
// real tokens (no BOS/EOS); the fixture's batch pins the padding (left, as
// tokenizer_config.json says) and labels (every pad-id token -> -100).
TEST(TokenizerOracleData, FineTuneRowsTokenizeLikeTransformers) {
  const std::string src = test_support::SourceDir();
  const json meta = ReadJson(FixtureDir() + "/finetune.json");
  auto file = io::SafetensorsFile::Open(FixtureDir() + "/finetune.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = LoadTokenizer(src + "/data/tiny_gemma");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_FALSE((*tok)->add_bos());
  EXPECT_EQ((*tok)->pad_id(), meta["pad_token_id"].get<int64_t>());
  EXPECT_EQ((*tok)->eos_id(), meta["eos_token_id"].get<int64_t>());
  EXPECT_EQ((*tok)->bos_id(), meta["bos_token_id"].get<int64_t>());
  EXPECT_EQ(meta["padding_side"], "left");
  const at::Tensor flat = *(*file)->Get("row_ids");        // [sum of lengths] int32
  const at::Tensor lengths = *(*file)->Get("row_lengths");  // [rows] int32
  std::ifstream in(src + "/data/instructions/train.jsonl");
  std::string line;
  int64_t row = 0, offset = 0;
  std::vector<std::vector<int64_t>> ours;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const json r = json::parse(line);
    const std::string text = absl::StrCat("Instruction: ", r["instruction"].get<std::string>(),
                                          "\nResponse: ", r["response"].get<std::string>());
    ASSERT_LT(row, lengths.size(0));
    const int64_t n = lengths[row].item<int64_t>();
    const at::Tensor want = flat.narrow(0, offset, n).to(at::kLong);
    ours.push_back((*tok)->Encode(text));
    ASSERT_EQ(ours.back(), std::vector<int64_t>(want.data_ptr<int64_t>(), want.data_ptr<int64_t>() + n))
        << "row " << row << ": " << text;
    offset += n;
    ++row;
  }
  EXPECT_EQ(row, meta["num_rows"].get<int64_t>());
  EXPECT_EQ(offset, flat.size(0));
  // The collated batch: left padding to max_length, mask, labels with -100 at
  // every pad-id position.
  const int64_t max_len = meta["max_length"].get<int64_t>();
  const at::Tensor ids = *(*file)->Get("batch.input_ids");  // [8, 512]
  const at::Tensor mask = *(*file)->Get("batch.attention_mask");
  const at::Tensor labels = *(*file)->Get("batch.labels");
  const auto batch_rows = meta["batch_rows"].get<std::vector<int64_t>>();
  for (size_t b = 0; b < batch_rows.size(); ++b) {
    const std::vector<int64_t>& real = ours[batch_rows[b]];
    const int64_t pad = max_len - static_cast<int64_t>(real.size());
    for (int64_t j = 0; j < max_len; ++j) {
      const bool is_real = j >= pad;
      const int64_t id = is_real ? real[j - pad] : (*tok)->pad_id();
      ASSERT_EQ(ids[b][j].item<int64_t>(), id) << "row " << b << " pos " << j;
      ASSERT_EQ(mask[b][j].item<int64_t>(), is_real ? 1 : 0) << "row " << b << " pos " << j;
      ASSERT_EQ(labels[b][j].item<int64_t>(), id == (*tok)->pad_id() ? kIgnoreIndex : id) << "row " << b;
    }
  }
  // pad == eos: the collator also drops the label of every real <eos>.
  const at::Tensor eos_ids = *(*file)->Get("eos_pad.input_ids");
  const at::Tensor eos_labels = *(*file)->Get("eos_pad.labels");
  const at::Tensor eos_mask = *(*file)->Get("eos_pad.attention_mask");
  const int64_t eos = (*tok)->eos_id();
  EXPECT_TRUE(eos_labels.eq(kIgnoreIndex).equal(eos_ids.eq(eos)));
  EXPECT_GT(eos_mask.eq(1).logical_and(eos_ids.eq(eos)).sum().item<int64_t>(), 0)
      << "the fixture has real <eos> tokens whose label the collator drops";
  const auto texts = meta["eos_pad"]["texts"].get<std::vector<std::string>>();
  for (size_t b = 0; b < texts.size(); ++b) {
    const std::vector<int64_t> real = (*tok)->Encode(texts[b]);
    const int64_t len = eos_ids.size(1);
    const at::Tensor tail = eos_ids[b].narrow(0, len - static_cast<int64_t>(real.size()), real.size());
    EXPECT_EQ(std::vector<int64_t>(tail.data_ptr<int64_t>(), tail.data_ptr<int64_t>() + tail.numel()), real) << b;
  }
}
#endif  // TPU_DIST_ORACLE_NO_TORCH

}  // namespace
}  // namespace tpudist::models::gemma
