// Seed fidelity of the fine-tune's data path: every row of the bundled data
// (data/instructions/train.jsonl) through gemma_finetune's path -- the
// seed's prompt, the real Gemma tokenizer of data/tiny_gemma, the options
// SeedTokenizeOptions reads from its HF files, TokenizedDataset -- equals
// what the seed's Python makes with transformers: tokenizer(text,
// truncation=True, max_length=512, padding="max_length") then
// DataCollatorForLanguageModeling(mlm=False). Fixture:
// tests/oracles/fixtures/tokenizer/finetune.{safetensors,json}, written by
// tests/oracles/make_tokenizer_fixtures.py.
//
// The fixture holds every row's unpadded ids (row_ids, row_lengths; checked
// there to be exactly the left-padded rows transformers returns) and one
// collated batch of rows 0..7 as the collator returns it; and a pad == eos
// batch (eos_pad.*) for the collator's label rule when pad id == eos id.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/dolly_dataset.h"
#include "train/hf_tokenizer_call.h"
#include "train/tokenized_dataset.h"
#include "io/safetensors.h"
#include "models/gemma/model_dir.h"
#include "models/gemma/tokenizer.h"
#include "testing/source_dir.h"

namespace tpudist::train {
namespace {

namespace gemma = ::tpudist::models::gemma;
using json = nlohmann::json;

using test_support::SourceDir;

std::string FixtureDir() { return SourceDir() + "/tests/oracles/fixtures/tokenizer"; }

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

std::vector<int64_t> ToVector(const at::Tensor& t) {  // [n] any int dtype
  const at::Tensor l = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + l.numel());
}

// As gemma_finetune's (right truncation): the first max_length + 1 ids.
Encoder GemmaEncoder(const gemma::Tokenizer& tok, int64_t max_length) {
  return [&tok, max_length](absl::string_view text) -> absl::StatusOr<std::vector<int>> {
    const std::vector<int64_t> ids = tok.EncodeHead(text, max_length + 1, /*add_bos=*/false);
    return std::vector<int>(ids.begin(), ids.end());
  };
}

class SeedDataOracle : public ::testing::Test {
 protected:
  void SetUp() override {
    meta_ = ReadJson(FixtureDir() + "/finetune.json");
    auto file = io::SafetensorsFile::Open(FixtureDir() + "/finetune.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = *file;
    auto tok = gemma::LoadTokenizer(SourceDir() + "/data/tiny_gemma");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(*tok);
  }

  at::Tensor Get(const std::string& name) {
    auto t = file_->Get(name);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : at::Tensor();
  }

  // gemma_finetune's options for rows of max_length.
  TokenizeOptions Options(int64_t max_length) {
    auto o = SeedTokenizeOptions(SourceDir() + "/data/tiny_gemma", max_length,
                                 static_cast<int>(tok_->pad_id()),
                                 tok_->add_bos() ? static_cast<int>(tok_->bos_id()) : -1);
    EXPECT_TRUE(o.ok()) << o.status();
    return o.ok() ? *o : TokenizeOptions{};
  }

  json meta_;
  std::shared_ptr<const io::SafetensorsFile> file_;
  std::unique_ptr<gemma::Tokenizer> tok_;
};

TEST_F(SeedDataOracle, OptionsAreTheHfTokenizerCalls) {
  const TokenizeOptions o = Options(512);
  EXPECT_EQ(o.padding_side, meta_["padding_side"] == "left" ? Side::kLeft : Side::kRight);
  EXPECT_EQ(o.padding_side, Side::kLeft);
  EXPECT_EQ(o.pad_id, meta_["pad_token_id"].get<int>());
  EXPECT_FALSE(meta_["adds_bos"].get<bool>());
  EXPECT_EQ(o.bos_id, -1);  // transformers adds no BOS for this tokenizer
  EXPECT_EQ(o.eos_id, -1);  // nor EOS
  EXPECT_EQ(meta_["prompt"], "Instruction: {instruction}\\nResponse: {response}");
}

// Every row: ids, attention mask and labels identical to transformers'.
TEST_F(SeedDataOracle, EveryBundledRowEqualsTransformers) {
  const int64_t max_len = meta_["max_length"].get<int64_t>();
  const TokenizeOptions o = Options(max_len);
  auto rows = LoadDollySplit(SourceDir() + "/data/instructions/train.jsonl", "train");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(static_cast<int64_t>(rows->size()), meta_["num_rows"].get<int64_t>());
  auto ds = TokenizedDataset::Create(*rows, GemmaEncoder(*tok_, max_len), o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ(ds->seq_len(), max_len);
  EXPECT_EQ(ds->num_truncated(), meta_["truncated_rows"].get<int64_t>());

  const std::vector<int64_t> flat = ToVector(Get("row_ids"));         // [sum of lengths]
  const std::vector<int64_t> lengths = ToVector(Get("row_lengths"));  // [rows]
  ASSERT_EQ(static_cast<int64_t>(lengths.size()), ds->size());
  const int64_t pad = o.pad_id;
  int64_t offset = 0, mismatched = 0;
  for (int64_t i = 0; i < ds->size(); ++i) {
    const int64_t n = lengths[i];
    // transformers' row: [pad] * (L - n) + ids; mask 0/1; the collator's labels.
    std::vector<int64_t> want_ids(max_len - n, pad), want_mask(max_len - n, 0);
    want_ids.insert(want_ids.end(), flat.begin() + offset, flat.begin() + offset + n);
    want_mask.resize(max_len, 1);
    std::vector<int64_t> want_labels(want_ids);
    for (int64_t& v : want_labels) v = v == pad ? kIgnoreIndex : v;
    offset += n;
    const TokenizedRow got = ds->row(i);
    const bool same = got.input_ids == want_ids && got.attention_mask == want_mask &&
                      got.labels == want_labels && got.num_tokens == n;
    EXPECT_TRUE(same) << "row " << i << " (line " << (*rows)[i].line << "): "
                      << FormatPrompt((*rows)[i]);
    mismatched += !same;
  }
  EXPECT_EQ(offset, static_cast<int64_t>(flat.size()));
  EXPECT_EQ(mismatched, 0);
  std::cout << "[ seed ] " << ds->size() << " rows x " << max_len
            << ": ids, attention_mask, labels identical to transformers' (" << mismatched
            << " differ)\n";

  // The collated batch as DataCollatorForLanguageModeling returns it.
  const auto batch_rows = meta_["batch_rows"].get<std::vector<int64_t>>();
  auto batch = ds->MakeBatch(batch_rows);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_TRUE(batch->input_ids.equal(Get("batch.input_ids")));
  EXPECT_TRUE(batch->attention_mask.equal(Get("batch.attention_mask")));
  EXPECT_TRUE(batch->labels.equal(Get("batch.labels")));
  EXPECT_EQ(batch->num_tokens, batch->attention_mask.sum().item<int64_t>());
}

// With pad == eos (tokenizer.pad_token = tokenizer.eos_token, common in
// fine-tunes) the collator drops the label of every real <eos> too; our
// rows do the same.
TEST_F(SeedDataOracle, PadEqualsEosDropsRealEosLabelsLikeTheCollator) {
  const json& e = meta_["eos_pad"];
  const int64_t max_len = e["max_length"].get<int64_t>();
  TokenizeOptions o = Options(max_len);
  o.pad_id = e["pad_token_id"].get<int>();
  ASSERT_EQ(o.pad_id, tok_->eos_id());
  const at::Tensor ids = Get("eos_pad.input_ids");        // [3, 64]
  const at::Tensor mask = Get("eos_pad.attention_mask");  // [3, 64]
  const at::Tensor labels = Get("eos_pad.labels");        // [3, 64]
  const auto texts = e["texts"].get<std::vector<std::string>>();
  ASSERT_EQ(static_cast<int64_t>(texts.size()), ids.size(0));
  int64_t real_eos_unlabelled = 0;
  for (size_t b = 0; b < texts.size(); ++b) {
    const std::vector<int> enc = *GemmaEncoder(*tok_, max_len)(texts[b]);
    const TokenizedRow r = MakeRow(enc, o);
    EXPECT_EQ(r.input_ids, ToVector(ids[b])) << texts[b];
    EXPECT_EQ(r.attention_mask, ToVector(mask[b])) << texts[b];
    EXPECT_EQ(r.labels, ToVector(labels[b])) << texts[b];
    for (int64_t j = 0; j < max_len; ++j) {
      real_eos_unlabelled += r.attention_mask[j] == 1 && r.input_ids[j] == o.pad_id &&
                             r.labels[j] == kIgnoreIndex;
    }
  }
  EXPECT_GT(real_eos_unlabelled, 0);
}

}  // namespace
}  // namespace tpudist::train
