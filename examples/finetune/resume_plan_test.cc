// PlanResume: one rule for fresh starts and restarts (resume_plan.h).
#include "examples/finetune/resume_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "examples/finetune/internal/test_temp_dir.h"

namespace tpudist::finetune {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kBatches = 4;

class ResumePlanTest : public ::testing::Test {
 protected:
  std::unique_ptr<CheckpointManager> Open() {
    CheckpointManagerOptions o;
    o.storage_path = tmp_.path();
    o.run_name = "run";
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

TEST(EpochsDoneTest, EndOfEpochCountsTheEpoch) {
  CheckpointMetadata m;
  m.epoch = 1;
  m.step = 2;
  EXPECT_EQ(EpochsDone(m, 4), 1);
  m.step = 4;
  EXPECT_EQ(EpochsDone(m, 4), 2);
}

}  // namespace
}  // namespace tpudist::finetune
