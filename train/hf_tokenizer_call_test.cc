#include "train/hf_tokenizer_call.h"
#include "testing/source_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace tpudist::train {
namespace {

using ::testing::HasSubstr;

// A "<bos> $A <eos>" TemplateProcessing post-processor as tokenizers writes it.
const std::string kTemplate = R"({"type": "TemplateProcessing",
  "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
             {"SpecialToken": {"id": "<eos>", "type_id": 0}}],
  "pair": [],
  "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]},
                     "<eos>": {"id": "<eos>", "ids": [1], "tokens": ["<eos>"]}}})";
const std::string kBosEosTemplate = R"({"post_processor": )" + kTemplate + "}";

TEST(HfTokenizerCallTest, DefaultsAreHfs) {
  auto call = ParseHfTokenizerCall("", "");
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->padding_side, Side::kRight);
  EXPECT_EQ(call->truncation_side, Side::kRight);
  EXPECT_EQ(call->bos_id, -1);
  EXPECT_EQ(call->eos_id, -1);
  EXPECT_FALSE(call->has_tokenizer_json);
}

TEST(HfTokenizerCallTest, SidesFromConfig) {
  auto call = ParseHfTokenizerCall(R"({"padding_side": "left", "truncation_side": "left"})",
                                   R"({"post_processor": null})");
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->padding_side, Side::kLeft);
  EXPECT_EQ(call->truncation_side, Side::kLeft);
  EXPECT_TRUE(call->has_tokenizer_json);
  EXPECT_EQ(call->bos_id, -1);
  auto bad = ParseHfTokenizerCall(R"({"padding_side": "middle"})", "");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("padding_side"));
  EXPECT_FALSE(ParseHfTokenizerCall("{oops", "").ok());
  EXPECT_FALSE(ParseHfTokenizerCall("", "{oops").ok());
}

TEST(HfTokenizerCallTest, SpecialsFromThePostProcessorNotTheConfigFlags) {
  // transformers 5.23 follows the post-processor; add_bos_token/add_eos_token
  // in tokenizer_config.json change nothing.
  auto call = ParseHfTokenizerCall(R"({"add_bos_token": false, "add_eos_token": false})", kBosEosTemplate);
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->bos_id, 2);
  EXPECT_EQ(call->eos_id, 1);
  call = ParseHfTokenizerCall(R"({"add_bos_token": true, "add_eos_token": true})", "{}");
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->bos_id, -1);
  EXPECT_EQ(call->eos_id, -1);
  // Inside a Sequence processor, next to ByteLevel.
  const std::string seq =
      R"({"post_processor": {"type": "Sequence", "processors": [{"type": "ByteLevel"}, )" + kTemplate + "]}}";
  call = ParseHfTokenizerCall("", seq);
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->bos_id, 2);
  EXPECT_EQ(call->eos_id, 1);
  // Not modelled: a clear error.
  auto bert = ParseHfTokenizerCall("", R"({"post_processor": {"type": "BertProcessing"}})");
  ASSERT_FALSE(bert.ok());
  EXPECT_EQ(bert.status().code(), absl::StatusCode::kUnimplemented);
}

TEST(HfTokenizerCallTest, ToTokenizeOptions) {
  HfTokenizerCall call;
  call.padding_side = Side::kLeft;
  call.bos_id = 2;
  const TokenizeOptions o = ToTokenizeOptions(call, 64, 0);
  EXPECT_EQ(o.max_length, 64);
  EXPECT_EQ(o.pad_id, 0);
  EXPECT_EQ(o.bos_id, 2);
  EXPECT_EQ(o.eos_id, -1);
  EXPECT_EQ(o.padding_side, Side::kLeft);
  EXPECT_EQ(o.truncation_side, Side::kRight);
}

TEST(HfTokenizerCallTest, BundledTinyGemma) {
  const std::string dir = test_support::SourceDir() + "/data/tiny_gemma";
  auto call = ReadHfTokenizerCall(dir);
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->padding_side, Side::kLeft);
  EXPECT_EQ(call->truncation_side, Side::kRight);
  EXPECT_EQ(call->bos_id, -1);
  EXPECT_EQ(call->eos_id, -1);
  EXPECT_TRUE(call->has_tokenizer_json);
  auto none = ReadHfTokenizerCall("/nonexistent/dir");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_tokenizer_json);
}

}  // namespace
}  // namespace tpudist::train
