#include "examples/finetune/dolly_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "examples/finetune/internal/test_temp_dir.h"

namespace tpudist::finetune {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

constexpr char kGood[] =
    R"({"instruction":"Add 2 and 3.","context":"","response":"5","category":"open_qa"})"
    "\n"
    R"({"instruction":"Sum","context":"a=1","response":"1","category":"closed_qa","extra":7})"
    "\r\n"
    "\n"
    R"({"category":"brainstorming","response":"r","context":"","instruction":"é ✓"})"
    "\n";

TEST(DollyDatasetTest, ParsesRecordsAndLineNumbers) {
  auto rows = ParseDollyJsonl(kGood, "good.jsonl");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  EXPECT_EQ((*rows)[0].instruction, "Add 2 and 3.");
  EXPECT_EQ((*rows)[0].response, "5");
  EXPECT_EQ((*rows)[0].line, 1);
  EXPECT_EQ((*rows)[1].context, "a=1");
  EXPECT_EQ((*rows)[1].category, "closed_qa");
  EXPECT_EQ((*rows)[2].line, 4);  // blank line 3 skipped
  EXPECT_EQ((*rows)[2].instruction, "é ✓");
}

TEST(DollyDatasetTest, BadJsonNamesFileLineAndParseError) {
  const std::string doc =
      R"({"instruction":"a","context":"","response":"b","category":"open_qa"})"
      "\n{\"instruction\": \"a\",\n";
  auto rows = ParseDollyJsonl(doc, "x.jsonl");
  ASSERT_FALSE(rows.ok());
  EXPECT_THAT(Msg(rows.status()),
              AllOf(HasSubstr("x.jsonl:2:"), HasSubstr("bad JSON"),
                    HasSubstr("parse_error")));
}

TEST(DollyDatasetTest, MissingFieldAndWrongType) {
  auto r = ParseDollyLine(R"({"instruction":"a","context":"","category":"x"})",
                          "f.jsonl", 9);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(Msg(r.status()),
              AllOf(HasSubstr("f.jsonl:9:"), HasSubstr("missing field"),
                    HasSubstr("\"response\"")));
  r = ParseDollyLine(
      R"({"instruction":"a","context":3,"response":"b","category":"x"})",
      "f.jsonl", 4);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(Msg(r.status()),
              AllOf(HasSubstr("f.jsonl:4:"), HasSubstr("\"context\""),
                    HasSubstr("must be a string"), HasSubstr("number")));
  r = ParseDollyLine(R"(["instruction"])", "f.jsonl", 1);
  EXPECT_THAT(Msg(r.status()), HasSubstr("expected a JSON object, got array"));
}

TEST(DollyDatasetTest, EmptyFileIsAnError) {
  for (const char* doc : {"", "\n\n  \n"}) {
    auto r = ParseDollyJsonl(doc, "empty.jsonl");
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(Msg(r.status()), HasSubstr("empty.jsonl: empty file"));
  }
}

TEST(DollyDatasetTest, ReadsFilesAndSplits) {
  internal::TestTempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string path = tmp.path() + "/d.jsonl";
  {
    std::ofstream out(path);
    for (int i = 0; i < 20; ++i) {
      out << R"({"instruction":"q)" << i
          << R"(","context":"","response":"r","category":"open_qa"})" << "\n";
    }
  }
  auto all = LoadDollySplit(path, "train");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 20u);
  auto head = LoadDollySplit(path, "train[:10%]");
  ASSERT_TRUE(head.ok());
  ASSERT_EQ(head->size(), 2u);
  EXPECT_EQ((*head)[1].instruction, "q1");
  auto tail = LoadDollySplit(path, "train[-3:]");
  ASSERT_TRUE(tail.ok());
  ASSERT_EQ(tail->size(), 3u);
  EXPECT_EQ((*tail)[0].instruction, "q17");
  EXPECT_EQ((*tail)[0].line, 18);

  auto empty = LoadDollySplit(path, "train[30:]");
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(Msg(empty.status()),
              AllOf(HasSubstr(path), HasSubstr("train[30:]"),
                    HasSubstr("selects no rows")));
  auto name = LoadDollySplit(path, "test[:5]");
  EXPECT_THAT(Msg(name.status()),
              AllOf(HasSubstr("unknown split 'test'"), HasSubstr(path)));
  auto malformed = LoadDollySplit(path, "train[:x]");
  EXPECT_THAT(Msg(malformed.status()), HasSubstr("'train[:x]'"));

  auto missing = ReadDollyJsonl(tmp.path() + "/nope.jsonl");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(missing.status()), HasSubstr("nope.jsonl"));
  auto dir = ReadDollyJsonl(tmp.path());
  EXPECT_FALSE(dir.ok());
  EXPECT_THAT(Msg(dir.status()), HasSubstr("is a directory"));
}

}  // namespace
}  // namespace tpudist::finetune
