// PlanResume: one rule for fresh starts and restarts (resume_plan.h).
#include "train/resume_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "train/internal/fs_util.h"
#include "train/internal/test_temp_dir.h"

namespace tpudist::train {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr int64_t kBatches = 4;

class ResumePlanTest : public ::testing::Test {
 protected:
  std::unique_ptr<CheckpointManager> Open(CheckpointFileOps ops = {}) {
    CheckpointManagerOptions o;
    o.storage_path = tmp_.path();
    o.run_name = "run";
    o.file_ops = std::move(ops);
    o.io_retry.first_backoff = absl::Milliseconds(1);
    o.warn = [](absl::string_view) {};
    o.error = [this](absl::string_view m) { errors_.emplace_back(m); };
    return *CheckpointManager::Open(o);
  }
  static JobFingerprint Job(const std::string& lr) { return {{"lr", lr}, {"seed", "5"}}; }
  // A checkpoint at the end of 0-based `epoch`.
  static CheckpointInfo Save(CheckpointManager& m, int64_t epoch, const JobFingerprint& job) {
    auto p = m.BeginWrite();
    std::ofstream(p->path + "/model.safetensors") << "w" << epoch;
    return *m.Commit(*p, {epoch, kBatches, 1.0 / (epoch + 1), job});
  }
  ResumeRequest Request(const std::string& lr, int64_t num_epochs = 3) const {
    return {Job(lr), false, num_epochs, kBatches};
  }

  internal::TestTempDir tmp_;
  std::vector<std::string> errors_;
};

TEST_F(ResumePlanTest, NoCheckpointIsAFreshStart) {
  auto m = Open();
  auto plan = PlanResume(*m, Request("0.003"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kind, StartKind::kFresh);
  EXPECT_EQ(plan->epochs_done, 0);
  EXPECT_EQ(plan->job, Job("0.003"));
}

TEST_F(ResumePlanTest, SameJobResumesFromTheNewest) {
  auto m = Open();
  Save(*m, 0, Job("0.003"));
  const CheckpointInfo second = Save(*m, 1, Job("0.003"));
  auto plan = PlanResume(*m, Request("0.003"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kind, StartKind::kResume);
  EXPECT_EQ(plan->checkpoint->path, second.path);
  EXPECT_EQ(plan->epochs_done, 2);
}

TEST_F(ResumePlanTest, AllEpochsDoneIsFinished) {
  auto m = Open();
  for (int64_t e = 0; e < 3; ++e) Save(*m, e, Job("0.003"));
  auto plan = PlanResume(*m, Request("0.003"));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->kind, StartKind::kFinished);
  EXPECT_EQ(plan->epochs_done, 3);
}

TEST_F(ResumePlanTest, AnotherJobIsRefusedNamingFieldsAndWaysOut) {
  auto m = Open();
  const CheckpointInfo c = Save(*m, 0, Job("0.003"));
  auto plan = PlanResume(*m, Request("0.001"));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(plan.status().message()),
              AllOf(HasSubstr("different job"), HasSubstr(c.path), HasSubstr("lr: 0.003 in the checkpoint, 0.001 now"),
                    HasSubstr("new --run-name"), HasSubstr("--resume-mismatched")));
  ResumeRequest anyway = Request("0.001");
  anyway.allow_mismatch = true;
  auto forced = PlanResume(*m, anyway);
  ASSERT_TRUE(forced.ok());
  EXPECT_EQ(forced->kind, StartKind::kResume);
  EXPECT_THAT(forced->differences, ElementsAre("lr: 0.003 in the checkpoint, 0.001 now"));
}

TEST_F(ResumePlanTest, OnlyCorruptCheckpointsIsAnErrorNotAFreshStart) {
  auto m = Open();
  const CheckpointInfo c = Save(*m, 0, Job("0.003"));
  std::ofstream(c.path + "/model.safetensors", std::ios::binary | std::ios::in | std::ios::out) << "X";
  auto plan = PlanResume(*m, Request("0.003"));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(plan.status().message()),
              AllOf(HasSubstr(c.path + "/model.safetensors"), HasSubstr("new --run-name")));
  EXPECT_THAT(errors_, ElementsAre(HasSubstr(c.path + "/model.safetensors")));
}

// Issue 39: one bit in checkpoint.json ("epoch":1 -> "epoch":3) made a run
// with one epoch left look finished ("Training already completed", exit 0).
TEST_F(ResumePlanTest, FlippedEpochInTheNewestManifestResumesFromTheOlderOne) {
  auto m = Open();
  const CheckpointInfo first = Save(*m, 0, Job("0.003"));
  const CheckpointInfo second = Save(*m, 1, Job("0.003"));
  const std::string marker = second.path + "/checkpoint.json";
  auto body = internal::ReadFile(marker);
  ASSERT_TRUE(body.ok());
  body->replace(body->find("\"epoch\":1"), 9, "\"epoch\":3");
  ASSERT_TRUE(internal::WriteFileSynced(marker, *body).ok());
  auto plan = PlanResume(*m, Request("0.003"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kind, StartKind::kResume);
  EXPECT_EQ(plan->checkpoint->path, first.path);
  EXPECT_EQ(plan->epochs_done, 1);
  EXPECT_THAT(errors_, ElementsAre(HasSubstr(marker + " is corrupt")));
}

// Issue 39: an EIO while reading checkpoint.json quarantined the only
// checkpoint. Transient: retried, resumed. Persistent: an I/O error naming
// the file and what to do, nothing quarantined.
TEST_F(ResumePlanTest, ReadErrorIsRetriedThenReportedAsAnIoError) {
  int failures_left = 1;
  CheckpointFileOps ops;
  ops.read_file = [&failures_left](const std::string& p) -> absl::StatusOr<std::string> {
    if (absl::EndsWith(p, "/checkpoint.json") && failures_left != 0) {
      if (failures_left > 0) --failures_left;
      return absl::InternalError(absl::StrCat("read '", p, "': Input/output error"));
    }
    return internal::ReadFile(p);
  };
  auto m = Open(ops);
  const CheckpointInfo c = Save(*m, 0, Job("0.003"));
  failures_left = 1;
  auto plan = PlanResume(*m, Request("0.003"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kind, StartKind::kResume);
  EXPECT_EQ(plan->checkpoint->path, c.path);

  failures_left = -1;
  auto failed = PlanResume(*m, Request("0.003"));
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_THAT(std::string(failed.status().message()),
              AllOf(HasSubstr("I/O error reading '" + c.path + "/checkpoint.json'"),
                    HasSubstr("Input/output error"), HasSubstr("check the storage"),
                    Not(HasSubstr("--run-name"))));
  EXPECT_THAT(errors_, IsEmpty());
  failures_left = 0;
  auto recovered = PlanResume(*m, Request("0.003"));
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->checkpoint->path, c.path);
}

TEST(EpochsDoneTest, EndOfEpochCountsTheEpoch) {
  CheckpointMetadata m;
  m.epoch = 1;
  m.step = 2;
  EXPECT_EQ(EpochsDone(m, 4), 1);
  m.step = 4;
  EXPECT_EQ(EpochsDone(m, 4), 2);
}

}  // namespace
}  // namespace tpudist::train
