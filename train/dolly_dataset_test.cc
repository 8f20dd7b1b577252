#include "train/dolly_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdio.h>

#include <fstream>
#include <iostream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "train/internal/test_temp_dir.h"

namespace tpudist::train {
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

TEST(DollyDatasetTest, RowByteLimitFollowsTheSequenceLength) {
  EXPECT_EQ(MaxRowBytesForSeqLen(512), int64_t{1} << 20);  // the 1 MiB floor
  EXPECT_EQ(MaxRowBytesForSeqLen(4096), int64_t{4} << 20);
  EXPECT_EQ(MaxRowBytesForSeqLen(0), kMinMaxRowBytes);
  EXPECT_GT(MaxRowBytesForSeqLen(int64_t{1} << 62), 0);  // saturates, no overflow
}

TEST(DollyDatasetTest, OversizeRowIsRefusedNamingLineAndSize) {
  const std::string row =
      R"({"instruction":"a","context":"","response":"r","category":"x"})";
  const std::string doc = absl::StrCat(row, "\n", row, "\n");
  auto ok = ParseDollyJsonl(doc, "x.jsonl", row.size());
  ASSERT_TRUE(ok.ok()) << ok.status();  // exactly at the limit
  auto r = ParseDollyJsonl(doc, "x.jsonl", row.size() - 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(r.status()),
              AllOf(HasSubstr(absl::StrCat("x.jsonl:1: row is ", row.size(),
                                           " bytes, over the limit of ",
                                           row.size() - 1, " bytes per row")),
                    HasSubstr("shorten or remove the row")));

  internal::TestTempDir tmp;
  const std::string path = tmp.path() + "/d.jsonl";
  std::ofstream(path) << row << "\n"
                      << std::string(100000, ' ') << "\n"
                      << row << "\n";
  auto whole = ReadDollyJsonl(path, 200000);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->size(), 2u);
  EXPECT_EQ((*whole)[1].line, 3);
  auto over = ReadDollyJsonl(path, 99999);
  EXPECT_THAT(Msg(over.status()),
              HasSubstr(path + ":2: row is 100000 bytes, over the limit of 99999"));
  // Only measured up to 64 x the limit.
  auto far = ReadDollyJsonl(path, 1000);
  EXPECT_THAT(Msg(far.status()), HasSubstr(path + ":2: row is at least "));
}

// Peak resident memory of this process (VmHWM), in bytes; -1 if unknown.
int64_t PeakRss() {
  FILE* f = fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t kb = -1;
  while (fgets(line, sizeof(line), f) != nullptr) {
    if (std::string(line).rfind("VmHWM:", 0) == 0) {
      std::string v = std::string(line + 6);
      v.erase(v.find("kB"));
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &kb)) kb = -1;
    }
  }
  fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

// Issue 39: a 50 MB row took 20 s and 741 MB RSS before any check. Now it is
// refused after a scan (no parse, no copy): bounded time and memory.
TEST(DollyHugeRowTest, FiftyMegabyteRowIsRefusedFastInBoundedMemory) {
  internal::TestTempDir tmp;
  const std::string path = tmp.path() + "/big.jsonl";
  const std::string head = R"({"instruction":")";
  const std::string tail =
      R"(","context":"","response":"r","category":"x"})";
  const int64_t text_bytes = int64_t{50} << 20;
  {
    std::ofstream out(path, std::ios::binary);
    out << R"({"instruction":"a","context":"","response":"r","category":"x"})"
        << "\n" << head;
    const std::string chunk(1 << 20, 'a');
    for (int64_t i = 0; i < text_bytes / static_cast<int64_t>(chunk.size()); ++i) {
      out << chunk;
    }
    out << tail << "\n";
  }
  // Reset the peak (Linux clear_refs 5) so it measures only the load.
  { std::ofstream("/proc/self/clear_refs") << "5"; }
  const int64_t rss_before = PeakRss();
  const absl::Time t0 = absl::Now();
  auto rows = LoadDollySplit(path, "train[:1024]", MaxRowBytesForSeqLen(512));
  const absl::Duration took = absl::Now() - t0;
  const int64_t rss_after = PeakRss();
  const int64_t line_bytes =
      static_cast<int64_t>(head.size() + tail.size()) + text_bytes;
  EXPECT_THAT(Msg(rows.status()),
              HasSubstr(absl::StrCat(path, ":2: row is ", line_bytes,
                                     " bytes, over the limit of 1048576")));
  std::cout << "[huge row] refused in " << absl::FormatDuration(took)
            << ", peak RSS grew by " << (rss_after - rss_before) / 1024
            << " KiB\n";
  EXPECT_LT(took, absl::Seconds(5));  // measured: ~30 ms; it was 20 s
  if (rss_before > 0 && rss_after > 0) {
    EXPECT_LT(rss_after - rss_before, int64_t{8} << 20);  // it was 741 MB
  }
}

}  // namespace
}  // namespace tpudist::train
