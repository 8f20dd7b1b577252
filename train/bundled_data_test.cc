// Checks the bundled instruction set (data/instructions/train.jsonl) loads
// through the reader, is big and varied enough, and is exactly what the
// committed generator produces.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "train/dolly_dataset.h"
#include "train/internal/fs_util.h"
#include "train/internal/test_temp_dir.h"
#include "testing/source_dir.h"

namespace tpudist::train {
namespace {

using test_support::SourceDir;

TEST(BundledDataTest, LoadsAndIsVaried) {
  const std::string path = SourceDir() + "/data/instructions/train.jsonl";
  auto rows = ReadDollyJsonl(path);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_GE(rows->size(), 1200u);
  const std::set<std::string> dolly = {
      "open_qa",      "closed_qa",         "general_qa",
      "classification", "brainstorming",   "information_extraction",
      "summarization", "creative_writing"};
  std::map<std::string, int> per_category;
  std::set<std::string> distinct;
  for (const DollyExample& ex : *rows) {
    EXPECT_TRUE(dolly.count(ex.category)) << "line " << ex.line << ": "
                                          << ex.category;
    EXPECT_FALSE(ex.instruction.empty()) << "line " << ex.line;
    EXPECT_FALSE(ex.response.empty()) << "line " << ex.line;
    per_category[ex.category]++;
    distinct.insert(ex.instruction + "\x1f" + ex.context);
  }
  EXPECT_EQ(per_category.size(), dolly.size());  // every category used
  for (const auto& [cat, n] : per_category) EXPECT_GE(n, 50) << cat;
  EXPECT_EQ(distinct.size(), rows->size()) << "duplicate prompts";
  // The seed's default split works on it.
  auto head = LoadDollySplit(path, "train[:1024]");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->size(), 1024u);
}

TEST(BundledDataTest, GeneratorReproducesTheFile) {
  if (std::system("python3 --version > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 not available";
  }
  internal::TestTempDir tmp;
  const std::string out = tmp.path() + "/train.jsonl";
  const std::string cmd =
      absl::StrCat("timeout 60 python3 ", SourceDir(),
                   "/data/instructions/generate.py --output ", out);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto fresh = internal::ReadFile(out);
  auto committed =
      internal::ReadFile(SourceDir() + "/data/instructions/train.jsonl");
  ASSERT_TRUE(fresh.ok() && committed.ok());
  EXPECT_TRUE(*fresh == *committed)
      << "data/instructions/train.jsonl is stale: rerun generate.py";
}

}  // namespace
}  // namespace tpudist::train
