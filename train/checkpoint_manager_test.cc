#include "train/checkpoint_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "train/internal/fs_util.h"
#include "train/internal/test_temp_dir.h"

namespace tpudist::train {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::SizeIs;

class CheckpointManagerTest : public ::testing::Test {
 protected:
  CheckpointManagerOptions Options(int num_to_keep) {
    CheckpointManagerOptions o;
    o.storage_path = tmp_.path() + "/storage";
    o.run_name = "gemma_run";
    o.num_to_keep = num_to_keep;
    // A fake clock: one second per call, so names are predictable.
    o.now = [this] { return absl::FromUnixSeconds(1'800'000'000 + ticks_++); };
    o.warn = [this](absl::string_view m) { warnings_.emplace_back(m); };
    return o;
  }
  std::unique_ptr<CheckpointManager> Open(int num_to_keep = 0) {
    auto m = CheckpointManager::Open(Options(num_to_keep));
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }
  static void WriteFile(const std::string& path, const std::string& body) {
    std::filesystem::create_directories(
        std::filesystem::path(path).parent_path());
    std::ofstream(path, std::ios::binary) << body;
  }
  CheckpointInfo Save(CheckpointManager& m, int64_t epoch, double loss,
                      const std::string& payload = "weights") {
    auto p = m.BeginWrite();
    EXPECT_TRUE(p.ok()) << p.status();
    WriteFile(p->path + "/model.pt", payload);
    WriteFile(p->path + "/shards/rank_1.pt", payload + payload);
    auto info = m.Commit(*p, {epoch, 10 * epoch, loss, {}});
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? *info : CheckpointInfo{};
  }
  std::vector<std::string> Entries(const std::string& dir) {
    auto names = internal::ListDir(dir);
    return names.ok() ? *names : std::vector<std::string>{};
  }

  internal::TestTempDir tmp_;
  int64_t ticks_ = 0;
  std::vector<std::string> warnings_;
};

TEST_F(CheckpointManagerTest, CommitLayoutAndMetadata) {
  auto m = Open();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->run_dir(), tmp_.path() + "/storage/gemma_run");
  auto p = m->BeginWrite();
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(absl::StartsWith(p->path, m->run_dir() + "/.tmp_checkpoint_"));
  WriteFile(p->path + "/model.pt", std::string(1000, 'w'));
  WriteFile(p->path + "/shards/rank_3.pt", "abc");
  auto info = m->Commit(*p, {2, 17, 1.25, {}});
  ASSERT_TRUE(info.ok()) << info.status();
  // Clock: BeginWrite = tick 0, Commit's created = tick 1, name = tick 2.
  EXPECT_EQ(info->path,
            m->run_dir() + "/checkpoint_2027-01-15_08-00-02.000000");
  EXPECT_FALSE(internal::IsDirectory(p->path));
  EXPECT_THAT(Entries(m->run_dir()), SizeIs(1));

  auto body = internal::ReadFile(info->path + "/checkpoint.json");
  ASSERT_TRUE(body.ok());
  auto meta = ParseCheckpointMetadata(*body, "checkpoint.json");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_TRUE(meta->complete);
  EXPECT_EQ(meta->sequence, 1);
  EXPECT_EQ(meta->epoch, 2);
  EXPECT_EQ(meta->step, 17);
  EXPECT_DOUBLE_EQ(meta->loss, 1.25);
  ASSERT_THAT(meta->files, SizeIs(2));
  EXPECT_EQ(meta->files[0].path, "model.pt");
  EXPECT_EQ(meta->files[0].bytes, 1000);
  EXPECT_EQ(meta->files[1].path, "shards/rank_3.pt");
  EXPECT_EQ(meta->files[1].bytes, 3);
  EXPECT_FALSE(std::filesystem::exists(info->path + "/checkpoint.json.tmp"));

  auto latest = m->LatestComplete();
  ASSERT_TRUE(latest.ok());
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ((*latest)->path, info->path);
  EXPECT_TRUE(warnings_.empty());
}

TEST_F(CheckpointManagerTest, AbandonedWriteIsNeverComplete) {
  auto m = Open();
  const CheckpointInfo first = Save(*m, 1, 3.0);
  // A "crash": files written into the temp dir, no Commit, process gone.
  auto p = m->BeginWrite();
  ASSERT_TRUE(p.ok());
  WriteFile(p->path + "/model.pt", "half");
  m.reset();
  auto again = Open();
  EXPECT_FALSE(std::filesystem::exists(p->path));  // stale temp removed
  ASSERT_THAT(warnings_, SizeIs(1));
  EXPECT_THAT(warnings_[0], HasSubstr("stale temporary checkpoint"));
  auto latest = again->LatestComplete();
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ((*latest)->path, first.path);
  // Explicit abandon removes the temp dir at once.
  auto q = again->BeginWrite();
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(again->Abandon(*q).ok());
  EXPECT_FALSE(std::filesystem::exists(q->path));
}

TEST_F(CheckpointManagerTest, CrashBeforeMarkerAndTruncationAreSkipped) {
  auto m = Open();
  const CheckpointInfo first = Save(*m, 1, 3.0);
  const CheckpointInfo second = Save(*m, 2, 2.0, "longer weights");
  // Crash between rename and checkpoint.json: a final-named dir, no marker.
  WriteFile(m->run_dir() + "/checkpoint_2099-01-01_00-00-00.000000/model.pt",
            "x");
  // Truncate a file of the newest complete checkpoint.
  ASSERT_EQ(::truncate((second.path + "/shards/rank_1.pt").c_str(), 5), 0);
  auto latest = m->LatestComplete();
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ((*latest)->path, first.path);
  ASSERT_THAT(warnings_, SizeIs(2));
  const std::string all = warnings_[0] + "\n" + warnings_[1];
  EXPECT_THAT(all, HasSubstr("checkpoint_2099-01-01_00-00-00.000000': no "
                             "checkpoint.json"));
  EXPECT_THAT(all, HasSubstr("shards/rank_1.pt' has 5 bytes, checkpoint.json "
                             "records 28 (truncated?)"));
  // A torn marker is skipped too.
  WriteFile(first.path + "/checkpoint.json", "{\"format\": 1, \"seq");
  warnings_.clear();
  latest = m->LatestComplete();
  ASSERT_TRUE(latest.ok());
  EXPECT_FALSE(latest->has_value());
  ASSERT_THAT(warnings_, SizeIs(3));
  EXPECT_THAT(warnings_[0] + warnings_[1] + warnings_[2], HasSubstr("bad JSON"));
  // So is a marker that says complete=false (with a valid manifest_crc32:
  // edited in place it would fail that first).
  const CheckpointInfo third = Save(*m, 3, 1.0);
  CheckpointMetadata incomplete = third.metadata;
  incomplete.complete = false;
  WriteFile(third.path + "/checkpoint.json", CheckpointMetadataToJson(incomplete));
  warnings_.clear();
  EXPECT_FALSE(m->LatestComplete()->has_value());
  EXPECT_THAT(warnings_, Contains(HasSubstr("not marked complete")));
  // And one whose file disappeared.
  const CheckpointInfo fourth = Save(*m, 4, 1.0);
  EXPECT_EQ((*m->LatestComplete())->path, fourth.path);
  std::filesystem::remove(fourth.path + "/model.pt");
  warnings_.clear();
  EXPECT_FALSE(m->LatestComplete()->has_value());
  EXPECT_THAT(warnings_, Contains(HasSubstr("model.pt' unreadable")));
}

TEST_F(CheckpointManagerTest, NumToKeepFollowsRaySemantics) {
  auto m = Open(2);
  const auto c1 = Save(*m, 1, 3.0);
  const auto c2 = Save(*m, 2, 1.0);
  const auto c3 = Save(*m, 3, 2.0);  // best two: c2, c3 -> c1 pruned
  EXPECT_FALSE(std::filesystem::exists(c1.path));
  const auto c4 = Save(*m, 4, 9.0);  // worse than both, but latest: kept
  EXPECT_TRUE(std::filesystem::exists(c4.path));
  EXPECT_TRUE(std::filesystem::exists(c3.path));
  EXPECT_THAT(*m->ListComplete(), SizeIs(3));
  const auto c5 = Save(*m, 5, 8.0);  // now c4 goes; c5 is the latest
  EXPECT_FALSE(std::filesystem::exists(c4.path));
  EXPECT_TRUE(std::filesystem::exists(c5.path));
  const auto c6 = Save(*m, 6, 0.5);  // best: c6, c2 -> c3, c5 go
  auto all = m->ListComplete();
  ASSERT_TRUE(all.ok());
  ASSERT_THAT(*all, SizeIs(2));
  EXPECT_EQ((*all)[0].path, c2.path);
  EXPECT_EQ((*all)[1].path, c6.path);
  auto best = m->Best();
  ASSERT_TRUE(best.ok() && best->has_value());
  EXPECT_EQ((*best)->path, c6.path);
  EXPECT_EQ((*m->LatestComplete())->metadata.sequence, 6);
  // Reopening continues the sequence.
  m.reset();
  auto again = Open(2);
  EXPECT_EQ(Save(*again, 7, 0.1).metadata.sequence, 7);
  EXPECT_TRUE(warnings_.empty());
}

TEST_F(CheckpointManagerTest, NanLossRoundTripsAndRanksWorst) {
  auto m = Open(1);
  const auto a = Save(*m, 1, 5.0);
  const auto b = Save(*m, 2, std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(std::isnan((*m->LatestComplete())->metadata.loss));
  const auto c = Save(*m, 3, 7.0);
  EXPECT_TRUE(std::filesystem::exists(a.path));
  EXPECT_FALSE(std::filesystem::exists(b.path));
  EXPECT_TRUE(std::filesystem::exists(c.path));
}

TEST_F(CheckpointManagerTest, ErrorsNameThePath) {
  CheckpointManagerOptions o = Options(0);
  o.run_name = "a/b";
  EXPECT_EQ(CheckpointManager::Open(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.run_name = "";
  EXPECT_FALSE(CheckpointManager::Open(o).ok());
  o = Options(0);
  o.storage_path = "";
  EXPECT_FALSE(CheckpointManager::Open(o).ok());
  // storage_path is a file.
  WriteFile(tmp_.path() + "/file", "x");
  o = Options(0);
  o.storage_path = tmp_.path() + "/file";
  auto bad = CheckpointManager::Open(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(tmp_.path() + "/file"));

  auto m = Open();
  auto stray = m->Commit({tmp_.path() + "/elsewhere"}, {0, 0, 0, {}});
  EXPECT_EQ(stray.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stray.status().message()), HasSubstr("elsewhere"));
  auto p = m->BeginWrite();
  WriteFile(p->path + "/checkpoint.json", "{}");
  auto reserved = m->Commit(*p, {0, 0, 0, {}});
  EXPECT_THAT(std::string(reserved.status().message()), HasSubstr("reserved"));

  if (::geteuid() != 0) {  // root ignores permissions
    const std::string ro = tmp_.path() + "/ro";
    std::filesystem::create_directories(ro);
    ::chmod(ro.c_str(), 0500);
    o = Options(0);
    o.storage_path = ro;
    auto denied = CheckpointManager::Open(o);
    EXPECT_FALSE(denied.ok());
    EXPECT_THAT(std::string(denied.status().message()), HasSubstr(ro));
    ::chmod(ro.c_str(), 0700);
  }
}

}  // namespace
}  // namespace tpudist::train
