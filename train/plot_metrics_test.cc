// Runs tools/plot_metrics on a metrics.jsonl written by MetricsLog and checks
// the output is a PNG of the requested size.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "train/internal/fs_util.h"
#include "train/internal/test_temp_dir.h"
#include "train/metrics_log.h"
#include "testing/source_dir.h"

namespace tpudist::train {
namespace {

using test_support::SourceDir;

uint32_t BigEndian32(const std::string& s, size_t at) {
  return (static_cast<uint32_t>(static_cast<unsigned char>(s[at])) << 24) |
         (static_cast<uint32_t>(static_cast<unsigned char>(s[at + 1])) << 16) |
         (static_cast<uint32_t>(static_cast<unsigned char>(s[at + 2])) << 8) |
         static_cast<uint32_t>(static_cast<unsigned char>(s[at + 3]));
}

TEST(PlotMetricsTest, RendersAPng) {
  if (std::system("python3 --version > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 not available";
  }
  internal::TestTempDir tmp;
  auto log = MetricsLog::Open(tmp.path());
  ASSERT_TRUE(log.ok());
  const double losses[] = {3.14, 2.2, 1.7, 1.5, 1.45};
  for (int e = 1; e <= 5; ++e) {
    ASSERT_TRUE(log->Append({e, losses[e - 1], 28.0, 18000.0 + 150 * e, 64,
                             absl::FromUnixSeconds(1'800'000'000 + e)})
                    .ok());
  }
  const std::string png = tmp.path() + "/plot.png";
  const std::string cmd =
      absl::StrCat("timeout 60 python3 ", SourceDir(), "/tools/plot_metrics ",
                   log->path(), " -o ", png, " --width 640 --height 480");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto bytes = internal::ReadFile(png);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_GT(bytes->size(), 33u);
  EXPECT_EQ(bytes->substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(bytes->substr(12, 4), "IHDR");
  EXPECT_EQ(BigEndian32(*bytes, 16), 640u);
  EXPECT_EQ(BigEndian32(*bytes, 20), 480u);
  EXPECT_NE(bytes->find("IEND"), std::string::npos);

  // Tick labels stay distinct on a narrow range of large values (tokens/s
  // 14787..14891 once printed "14.8k" three times).
  auto narrow = MetricsLog::Open(tmp.path() + "/narrow");
  ASSERT_TRUE(narrow.ok());
  const double tps[] = {14855.5, 14787.1, 14891.7};
  for (int e = 1; e <= 3; ++e) {
    ASSERT_TRUE(narrow->Append({e, 5.0 - e, 8.8, tps[e - 1], 16,
                                absl::FromUnixSeconds(1'800'000'000 + e)})
                    .ok());
  }
  const std::string ticks_file = tmp.path() + "/ticks.txt";
  const std::string ticks_cmd =
      absl::StrCat("timeout 60 python3 ", SourceDir(), "/tools/plot_metrics ", narrow->path(),
                   " -o ", png, " --print-ticks > ", ticks_file);
  ASSERT_EQ(std::system(ticks_cmd.c_str()), 0) << ticks_cmd;
  auto ticks = internal::ReadFile(ticks_file);
  ASSERT_TRUE(ticks.ok()) << ticks.status();
  const size_t at = ticks->find("tokens/s: ");
  ASSERT_NE(at, std::string::npos) << *ticks;
  std::vector<std::string> labels = absl::StrSplit(
      absl::StripAsciiWhitespace(ticks->substr(at + 10, ticks->find('\n', at) - at - 10)), ' ');
  ASSERT_GE(labels.size(), 3u) << *ticks;
  for (size_t i = 1; i < labels.size(); ++i) {
    EXPECT_NE(labels[i], labels[i - 1]) << *ticks;
  }

  // A bad input fails with a message, not a traceback-free success.
  const std::string bad = absl::StrCat(
      "timeout 60 python3 ", SourceDir(), "/tools/plot_metrics ", tmp.path(),
      "/missing.jsonl -o ", png, " 2> /dev/null");
  EXPECT_NE(std::system(bad.c_str()), 0);
}

}  // namespace
}  // namespace tpudist::train
