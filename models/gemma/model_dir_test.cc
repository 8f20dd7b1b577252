#include "models/gemma/model_dir.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "testing/files.h"
#include "testing/temp_dir.h"
#include "testing/source_dir.h"

namespace tpudist::models::gemma {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string BundledDir() {
  return test_support::SourceDir() + "/data/tiny_gemma";
}

// A copy of the bundled model directory's tokenizer and config, with
// `edit` applied to config.json.
void CopyWithConfig(const test_support::ScopedTempDir& dir, const std::function<void(json*)>& edit) {
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(fs::path(BundledDir()) / f, dir / f);
  }
  std::ifstream in(fs::path(BundledDir()) / "config.json");
  json config = json::parse(in);
  edit(&config);
  test_support::WriteFile(dir / "config.json", config.dump());
}

TEST(ModelDir, MissingDirectoryIsSaidSoBeforeAnyFile) {
  test_support::ScopedTempDir dir("gemma_test");
  const std::string missing = dir / "typo";
  absl::Status st = CheckModelDir(missing);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(st.message(), absl::StrCat("model directory ", missing, " does not exist"));
  auto tok = LoadTokenizer(missing);
  EXPECT_EQ(tok.status().message(), st.message());  // not "no tokenizer.json"
  EXPECT_EQ(LoadTokenizerForModel(missing).status().message(), st.message());
  test_support::WriteFile(dir / "file", "x");
  EXPECT_EQ(CheckModelDir(dir / "file").message(), absl::StrCat("model directory ", dir / "file", " is not a directory"));
  EXPECT_TRUE(CheckModelDir(dir.path()).ok());
  // An existing directory without a tokenizer still says what is missing.
  EXPECT_NE(LoadTokenizer(dir.path()).status().message().find("no tokenizer.json"), std::string::npos);
}

TEST(ModelDir, BundledTokenizerFitsItsModel) {
  auto tok = LoadTokenizerForModel(BundledDir());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 512);
}

// A tokenizer with ids >= the model's vocab_size would index past the
// embedding at the first forward pass; loading says so, naming both files.
TEST(ModelDir, TokenizerIdsBeyondVocabAreRejected) {
  test_support::ScopedTempDir dir("gemma_test");
  CopyWithConfig(dir, [](json* c) { (*c)["text_config"]["vocab_size"] = 300; });
  auto tok = LoadTokenizerForModel(dir.path());
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(tok.status().message());
  EXPECT_NE(msg.find(dir / "tokenizer.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir / "config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ids go up to 511 (512 tokens including added tokens)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vocab_size 300"), std::string::npos) << msg;
  // A model with more rows than the tokenizer has ids is fine (HF pads vocabularies).
  test_support::ScopedTempDir bigger("gemma_test");
  CopyWithConfig(bigger, [](json* c) {
    (*c)["text_config"]["vocab_size"] = 640;
    (*c)["text_config"]["vocab_size_per_layer_input"] = 640;
  });
  EXPECT_TRUE(LoadTokenizerForModel(bigger.path()).ok());
}

TEST(ModelDir, AddedTokenBeyondVocabIsRejected) {
  test_support::ScopedTempDir dir("gemma_test");
  CopyWithConfig(dir, [](json*) {});
  std::ifstream in(dir / "tokenizer.json");
  json tok = json::parse(in);
  tok["added_tokens"].push_back({{"id", 700}, {"content", "<extra>"}, {"special", true}, {"normalized", false}});
  test_support::WriteFile(dir / "tokenizer.json", tok.dump());
  auto st = LoadTokenizerForModel(dir.path()).status();
  EXPECT_NE(st.message().find("ids go up to 700"), std::string::npos) << st;
  EXPECT_NE(st.message().find("vocab_size 512"), std::string::npos) << st;
}

}  // namespace
}  // namespace tpudist::models::gemma
