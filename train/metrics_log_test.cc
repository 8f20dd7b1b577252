#include "train/metrics_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "train/internal/fs_util.h"
#include "train/internal/test_temp_dir.h"

namespace tpudist::train {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, TokensPerSecond) {
  // 64 steps x global batch 32 x seq 256 / 28.17 s.
  EXPECT_NEAR(TokensPerSecond(64, 32, 256, 28.17), 64.0 * 32 * 256 / 28.17,
              1e-9);
  EXPECT_DOUBLE_EQ(TokensPerSecond(1, 1, 1, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(TokensPerSecond(10, 2, 8, 2.0), 80.0);
}

TEST(MetricsTest, FormatsTheRankZeroLine) {
  EpochMetrics m;
  m.epoch = 1;
  m.loss = 3.14021;
  m.epoch_time_s = 28.1749;
  m.tokens_per_s = 18613.54;
  EXPECT_EQ(FormatEpochLine(m, 3),
            "Epoch 1/3 | loss=3.1402 | epoch_time=28.17s | tokens/s=18613.5");
  m.epoch = 12;
  m.loss = 0.5;
  m.epoch_time_s = 1;
  m.tokens_per_s = 0;
  EXPECT_EQ(FormatEpochLine(m, 12),
            "Epoch 12/12 | loss=0.5000 | epoch_time=1.00s | tokens/s=0.0");
}

TEST(MetricsTest, JsonLineHasTheFieldsAndRoundTrips) {
  EpochMetrics m{2, 1.5, 10.25, 1234.5, 64, absl::FromUnixMillis(1'800'000'000'123)};
  const std::string line = EpochMetricsToJsonLine(m);
  ASSERT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1);
  auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["epoch"], 2);
  EXPECT_EQ(j["loss"], 1.5);
  EXPECT_EQ(j["epoch_time_s"], 10.25);
  EXPECT_EQ(j["tokens_per_s"], 1234.5);
  EXPECT_EQ(j["steps"], 64);
  EXPECT_EQ(j["timestamp"], "2027-01-15T08:00:00.123000+00:00");
  auto back = ParseEpochMetricsLine(line, "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->epoch, 2);
  EXPECT_EQ(back->steps, 64);
  EXPECT_EQ(back->timestamp, m.timestamp);
  m.loss = std::nan("");
  auto nan = ParseEpochMetricsLine(EpochMetricsToJsonLine(m), "x");
  ASSERT_TRUE(nan.ok());
  EXPECT_TRUE(std::isnan(nan->loss));
  EXPECT_THAT(std::string(ParseEpochMetricsLine("{\"epoch\":1}", "f:3")
                              .status()
                              .message()),
              HasSubstr("f:3: field \"steps\""));
}

TEST(MetricsTest, LogAppendsAcrossReopen) {
  internal::TestTempDir tmp;
  const std::string run = tmp.path() + "/run";
  {
    auto log = MetricsLog::Open(run);
    ASSERT_TRUE(log.ok());
    EXPECT_EQ(log->path(), run + "/metrics.jsonl");
    ASSERT_TRUE(log->Append({1, 3.0, 5.0, 100.0, 10, absl::FromUnixSeconds(1)}).ok());
  }
  auto log = MetricsLog::Open(run);  // a resumed run keeps appending
  ASSERT_TRUE(log->Append({2, 2.0, 5.0, 110.0, 10, absl::FromUnixSeconds(2)}).ok());
  auto all = ReadMetricsLog(run + "/metrics.jsonl");
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].epoch, 1);
  EXPECT_DOUBLE_EQ((*all)[1].loss, 2.0);
  std::ofstream(run + "/metrics.jsonl", std::ios::app) << "garbage\n";
  auto bad = ReadMetricsLog(run + "/metrics.jsonl");
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("metrics.jsonl:3: bad JSON"));
  // Unwritable location: the error names the path.
  std::ofstream(tmp.path() + "/file") << "x";
  auto blocked = MetricsLog::Open(tmp.path() + "/file/sub");
  ASSERT_FALSE(blocked.ok());
  EXPECT_THAT(std::string(blocked.status().message()), HasSubstr("/file/sub"));
}

TEST(MetricsTest, TrimAfterDropsLaterAndTornLinesOnce) {
  internal::TestTempDir tmp;
  auto log = MetricsLog::Open(tmp.path());
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(*log->TrimAfter(0), 0);  // no file yet: nothing to do
  for (int64_t e = 1; e <= 3; ++e) {
    EpochMetrics m;
    m.epoch = e;
    m.loss = 1.0 / e;
    ASSERT_TRUE(log->Append(m).ok());
  }
  ASSERT_TRUE(internal::AppendFileSynced(log->path(), "{\"epoch\":4,\"lo").ok());  // torn append
  auto dropped = log->TrimAfter(1);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(*dropped, 3);
  auto kept = ReadMetricsLog(log->path());
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_EQ(kept->size(), 1u);
  EXPECT_EQ((*kept)[0].epoch, 1);
  auto discarded = internal::ReadFile(tmp.path() + "/metrics.discarded.jsonl");
  ASSERT_TRUE(discarded.ok());
  EXPECT_THAT(*discarded, HasSubstr("\"epoch\":2,"));
  EXPECT_THAT(*discarded, HasSubstr("{\"epoch\":4,\"lo"));
  EXPECT_EQ(*log->TrimAfter(1), 0);  // idempotent
  // Continuing appends epoch 2 again: it appears exactly once.
  EpochMetrics m;
  m.epoch = 2;
  ASSERT_TRUE(log->Append(m).ok());
  EXPECT_EQ(ReadMetricsLog(log->path())->size(), 2u);
}

}  // namespace
}  // namespace tpudist::train
