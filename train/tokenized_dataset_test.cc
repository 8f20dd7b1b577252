#include "train/tokenized_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tpudist::train {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A byte-level stand-in for the Gemma tokenizer: byte b -> id b + 3, so ids
// never collide with pad 0 / eos 1 / bos 2.
absl::StatusOr<std::vector<int>> ByteEncode(absl::string_view text) {
  std::vector<int> ids;
  for (unsigned char c : text) ids.push_back(static_cast<int>(c) + 3);
  return ids;
}

DollyExample Ex(std::string instr, std::string ctx, std::string resp,
                int64_t line = 1) {
  return {std::move(instr), std::move(ctx), std::move(resp), "open_qa", line};
}

TEST(PromptTest, IsTheSeedsAndDropsContextByDefault) {
  // The seed: f"Instruction: {instruction}\nResponse: {response}", context
  // unused (an earlier version added a Context: line by default).
  EXPECT_EQ(FormatPrompt(Ex("Add 2 and 3.", "", "5")),
            "Instruction: Add 2 and 3.\nResponse: 5");
  EXPECT_EQ(FormatPrompt(Ex("Who?", "Ann wrote it.", "Ann")),
            "Instruction: Who?\nResponse: Ann");
}

TEST(PromptTest, IncludeContextAddsAContextLine) {
  EXPECT_EQ(FormatPrompt(Ex("Who?", "Ann wrote it.", "Ann"), true),
            "Instruction: Who?\nContext: Ann wrote it.\nResponse: Ann");
  EXPECT_EQ(FormatPrompt(Ex("Add 2 and 3.", "", "5"), true),
            "Instruction: Add 2 and 3.\nResponse: 5");
}

TEST(MakeRowTest, PadsAndMasks) {
  TokenizeOptions o{8, 0, 2, 1};
  const std::vector<int> ids = {10, 11, 12};
  TokenizedRow r = MakeRow(ids, o);
  EXPECT_THAT(r.input_ids, ElementsAre(2, 10, 11, 12, 1, 0, 0, 0));
  EXPECT_THAT(r.attention_mask, ElementsAre(1, 1, 1, 1, 1, 0, 0, 0));
  EXPECT_THAT(r.labels,
              ElementsAre(2, 10, 11, 12, 1, kIgnoreIndex, kIgnoreIndex,
                          kIgnoreIndex));
  EXPECT_EQ(r.num_tokens, 5);
  EXPECT_FALSE(r.truncated);
}

TEST(MakeRowTest, TruncatesKeepingTheHeadAndTheSpecials) {
  // HF (tokenizers' truncation) cuts the text to leave room for the
  // post-processor's specials, so bos and eos survive. (An earlier version
  // expected {2, 10, 11, 12}, dropping eos; transformers 5.23 gives this.)
  TokenizeOptions o{4, 0, 2, 1};
  const std::vector<int> ids = {10, 11, 12, 13, 14};
  TokenizedRow r = MakeRow(ids, o);
  EXPECT_THAT(r.input_ids, ElementsAre(2, 10, 11, 1));
  EXPECT_THAT(r.labels, ElementsAre(2, 10, 11, 1));
  EXPECT_THAT(r.attention_mask, ElementsAre(1, 1, 1, 1));
  EXPECT_TRUE(r.truncated);
  // truncation_side left keeps the tail.
  o.truncation_side = Side::kLeft;
  r = MakeRow(ids, o);
  EXPECT_THAT(r.input_ids, ElementsAre(2, 13, 14, 1));
  // Exactly full is not truncated; no bos/eos when ids < 0.
  r = MakeRow(std::vector<int>{5, 6, 7, 8}, TokenizeOptions{4, 0, -1, -1});
  EXPECT_FALSE(r.truncated);
  EXPECT_THAT(r.input_ids, ElementsAre(5, 6, 7, 8));
}

TEST(MakeRowTest, MaskIsByPositionLabelsByPadId) {
  // DataCollatorForLanguageModeling(mlm=False): labels[ids == pad_id] = -100,
  // so a real token equal to pad_id loses its label; the tokenizer's
  // attention mask still marks it real. (An earlier version kept its label,
  // masking labels by position; the seed's collator does not.)
  TokenizedRow r = MakeRow(std::vector<int>{7, 0, 7}, TokenizeOptions{5, 0, -1, -1});
  EXPECT_THAT(r.labels, ElementsAre(7, kIgnoreIndex, 7, kIgnoreIndex, kIgnoreIndex));
  EXPECT_THAT(r.attention_mask, ElementsAre(1, 1, 1, 0, 0));
  // pad == eos: the appended eos is real (mask 1) but unlabelled.
  r = MakeRow(std::vector<int>{7, 8}, TokenizeOptions{4, 1, -1, 1});
  EXPECT_THAT(r.input_ids, ElementsAre(7, 8, 1, 1));
  EXPECT_THAT(r.attention_mask, ElementsAre(1, 1, 1, 0));
  EXPECT_THAT(r.labels, ElementsAre(7, 8, kIgnoreIndex, kIgnoreIndex));
}

TEST(MakeRowTest, LeftPadding) {
  TokenizeOptions o{7, 0, 2, 1, Side::kLeft};
  TokenizedRow r = MakeRow(std::vector<int>{10, 11}, o);
  EXPECT_THAT(r.input_ids, ElementsAre(0, 0, 0, 2, 10, 11, 1));
  EXPECT_THAT(r.attention_mask, ElementsAre(0, 0, 0, 1, 1, 1, 1));
  EXPECT_THAT(r.labels, ElementsAre(kIgnoreIndex, kIgnoreIndex, kIgnoreIndex,
                                    2, 10, 11, 1));
  EXPECT_EQ(r.num_tokens, 4);
  // A full row has no padding on either side.
  r = MakeRow(std::vector<int>{10, 11, 12, 13, 14, 15, 16, 17}, o);
  EXPECT_THAT(r.input_ids, ElementsAre(2, 10, 11, 12, 13, 14, 1));
  EXPECT_THAT(r.attention_mask, ElementsAre(1, 1, 1, 1, 1, 1, 1));
}

TEST(TokenizedDatasetTest, LeftPaddedBatchesMatchMakeRow) {
  std::vector<DollyExample> ex = {Ex("a", "ctx", "b"), Ex("cc", "", "d"),
                                  Ex(std::string(100, 'z'), "", "e")};
  for (bool include_context : {false, true}) {
    TokenizeOptions o{40, 0, -1, -1, Side::kLeft, Side::kRight};
    auto ds = TokenizedDataset::Create(ex, ByteEncode, o, include_context);
    ASSERT_TRUE(ds.ok()) << ds.status();
    const std::vector<int64_t> idx = {0, 1, 2};
    auto batch = ds->MakeBatch(idx);
    ASSERT_TRUE(batch.ok()) << batch.status();
    int64_t total = 0;
    for (int64_t i = 0; i < 3; ++i) {
      const TokenizedRow want =
          MakeRow(*ByteEncode(FormatPrompt(ex[i], include_context)), o);
      const TokenizedRow got = ds->row(i);
      EXPECT_EQ(got.input_ids, want.input_ids) << i;
      EXPECT_EQ(got.attention_mask, want.attention_mask) << i;
      EXPECT_EQ(got.labels, want.labels) << i;
      for (int64_t j = 0; j < 40; ++j) {
        EXPECT_EQ(batch->input_ids[i][j].item<int64_t>(), want.input_ids[j]);
        EXPECT_EQ(batch->attention_mask[i][j].item<int64_t>(), want.attention_mask[j]);
        EXPECT_EQ(batch->labels[i][j].item<int64_t>(), want.labels[j]);
      }
      total += want.num_tokens;
    }
    EXPECT_EQ(batch->num_tokens, total);
    // Row 0's context shows up only with include_context.
    EXPECT_EQ(ds->row(0).num_tokens,
              static_cast<int64_t>(FormatPrompt(ex[0], include_context).size()));
  }
}

TEST(TokenizedDatasetTest, BatchesAreInt64WithOracleValues) {
  std::vector<DollyExample> ex = {Ex("a", "", "b"), Ex("cc", "x", "d"),  // 28, 29 tokens
                                  Ex(std::string(100, 'z'), "", "e")};
  TokenizeOptions o{48, 0, 2, 1};
  auto ds = TokenizedDataset::Create(ex, ByteEncode, o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->size(), 3);
  EXPECT_EQ(ds->num_truncated(), 1);
  const std::vector<int64_t> idx = {2, 0};
  auto batch = ds->MakeBatch(idx);
  ASSERT_TRUE(batch.ok()) << batch.status();
  for (const at::Tensor* t :
       {&batch->input_ids, &batch->labels, &batch->attention_mask}) {
    EXPECT_EQ(t->scalar_type(), at::kLong);
    EXPECT_EQ(t->sizes(), (at::IntArrayRef{2, 48}));
  }
  // Oracle: row 1 of the batch is example 0, built by hand.
  const std::string prompt = "Instruction: a\nResponse: b";
  std::vector<int64_t> want(48, 0);
  want[0] = 2;
  for (size_t i = 0; i < prompt.size(); ++i) {
    want[i + 1] = static_cast<unsigned char>(prompt[i]) + 3;
  }
  want[prompt.size() + 1] = 1;
  const int64_t real = static_cast<int64_t>(prompt.size()) + 2;
  auto ids = batch->input_ids[1];
  auto labels = batch->labels[1];
  auto mask = batch->attention_mask[1];
  for (int64_t j = 0; j < 48; ++j) {
    EXPECT_EQ(ids[j].item<int64_t>(), want[j]) << j;
    EXPECT_EQ(mask[j].item<int64_t>(), j < real ? 1 : 0) << j;
    EXPECT_EQ(labels[j].item<int64_t>(), j < real ? want[j] : kIgnoreIndex);
  }
  // The truncated row is all real tokens.
  EXPECT_EQ(batch->attention_mask[0].sum().item<int64_t>(), 48);
  EXPECT_EQ(batch->num_tokens, 48 + real);
  EXPECT_EQ(batch->attention_mask.sum().item<int64_t>(), batch->num_tokens);
  // The compact storage gives back exactly what MakeRow built.
  for (int64_t i = 0; i < ds->size(); ++i) {
    const TokenizedRow want_row = MakeRow(*ByteEncode(FormatPrompt(ex[i])), o);
    const TokenizedRow got = ds->row(i);
    EXPECT_EQ(got.input_ids, want_row.input_ids);
    EXPECT_EQ(got.labels, want_row.labels);
    EXPECT_EQ(got.attention_mask, want_row.attention_mask);
    EXPECT_EQ(got.num_tokens, want_row.num_tokens);
  }
}

TEST(TokenizedDatasetTest, Errors) {
  std::vector<DollyExample> ex = {Ex("a", "", "b", 7)};
  EXPECT_FALSE(TokenizedDataset::Create({}, ByteEncode, {}).ok());
  EXPECT_FALSE(TokenizedDataset::Create(ex, ByteEncode, {0, 0, -1, -1}).ok());
  EXPECT_FALSE(TokenizedDataset::Create(ex, ByteEncode, {8, -1, -1, -1}).ok());
  Encoder failing = [](absl::string_view) -> absl::StatusOr<std::vector<int>> {
    return absl::InternalError("tokenizer exploded");
  };
  auto bad = TokenizedDataset::Create(ex, failing, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("line 7: tokenizer exploded"));
  auto ds = TokenizedDataset::Create(ex, ByteEncode, {16, 0, -1, -1});
  ASSERT_TRUE(ds.ok());
  const std::vector<int64_t> oob = {0, 1};
  EXPECT_EQ(ds->MakeBatch(oob).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_FALSE(ds->MakeBatch({}).ok());
}

}  // namespace
}  // namespace tpudist::train
