// --async-checkpoint end to end (docs/finetune.md, "Asynchronous
// checkpoints"): gemma_finetune under tpurun, 2 ranks, the tiny model, 16
// rows, 3 epochs of 4 steps, every checkpoint kept.
//
//   - an async run prints the same epoch losses as a sync run, each of its
//     three checkpoints verifies (every byte against checkpoint.json), and
//     its model and optimizer shards and HF export are byte-identical to the
//     sync run's of the same epoch (the oracle: the synchronous path);
//   - rank 1 SIGKILLed by its writer thread in the middle of writing epoch
//     2's checkpoint (after its shard files, before it posts its part;
//     TPU_DIST_TEST_ASYNC_CKPT_DIE_RANK, attempt 0 only) with
//     --max-failures 1: nothing of epoch 2 was committed, the restart
//     resumes from epoch 1's checkpoint (the newest verified one), and the
//     run ends with the sync run's losses and bytes; no temp dir is left.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "train/checkpoint_manager.h"
#include "train/internal/finetune_process_for_test.h"
#include "train/internal/test_temp_dir.h"

namespace tpudist::train {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using internal::RunOutput;

constexpr int kWorld = 2;

std::string JobArgs() {
  return "--dataset-split train[:16] --num-epochs 3 --batch-size-per-device 2 --max-seq-len 32 --lr 3e-3 "
         "--num-to-keep 0 --seed 5 --bf16=false";
}

std::vector<std::string> EpochLines(const std::string& out) {
  std::vector<std::string> lines;
  for (absl::string_view l : absl::StrSplit(out, '\n')) {
    // "[rank 0] Epoch 2/3 | loss=5.5420 | epoch_time=..." -> "Epoch 2/3 | loss=5.5420"
    const size_t at = l.find("Epoch ");
    if (at == absl::string_view::npos || !absl::StrContains(l, " | loss=")) continue;
    l.remove_prefix(at);
    lines.emplace_back(l.substr(0, l.find(" | epoch_time")));
  }
  return lines;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class AsyncCheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new internal::TestTempDir();
    sync_ = new RunOutput(Run("sync", "", ""));
  }
  static void TearDownTestSuite() {
    delete sync_;
    delete tmp_;
  }
  static RunOutput Run(const std::string& run, const std::string& env, const std::string& extra,
                       const std::string& tpurun_args = "") {
    return internal::RunGemmaFinetune(
        env.empty() ? std::string(TPURUN_PATH) : absl::StrCat("env ", env, " ", TPURUN_PATH), GEMMA_FINETUNE_PATH,
        kWorld, tpurun_args,
        absl::StrCat("--storage-path ", tmp_->path(), " --run-name ", run, " ", JobArgs(), " ", extra), 240);
  }
  // The run's complete checkpoints, each verified, oldest first.
  static std::vector<CheckpointInfo> Verified(const std::string& run) {
    CheckpointManagerOptions mo;
    mo.storage_path = tmp_->path();
    mo.run_name = run;
    mo.num_to_keep = 0;
    absl::StatusOr<std::unique_ptr<CheckpointManager>> m = CheckpointManager::Open(mo);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return {};
    absl::StatusOr<std::vector<CheckpointInfo>> all = (*m)->ListComplete();
    EXPECT_TRUE(all.ok()) << all.status();
    if (!all.ok()) return {};
    for (const CheckpointInfo& c : *all) EXPECT_TRUE((*m)->Verify(c).ok()) << c.path;
    return *all;
  }
  // Same epochs, and byte-identical shards and HF weights, as the sync run.
  static void ExpectSameAsSync(const std::string& run) {
    const std::vector<CheckpointInfo> want = Verified("sync"), got = Verified(run);
    ASSERT_EQ(want.size(), 3u);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].metadata.epoch, want[i].metadata.epoch);
      for (const std::string f : {"shards/shard-0-of-2.safetensors", "shards/shard-1-of-2.safetensors",
                                  "shards/optim-0-of-2.safetensors", "shards/optim-1-of-2.safetensors",
                                  "shards/metadata.json", "model.safetensors", "trainer_state.json"}) {
        const std::string a = ReadAll(want[i].path + "/" + f), b = ReadAll(got[i].path + "/" + f);
        EXPECT_FALSE(a.empty()) << want[i].path << "/" << f;
        EXPECT_TRUE(a == b) << got[i].path << "/" << f << " differs from the sync run's";
      }
    }
    for (const auto& e : fs::directory_iterator(tmp_->path() + "/" + run)) {
      EXPECT_THAT(e.path().filename().string(), Not(HasSubstr(".tmp_checkpoint"))) << "temp dir left behind";
    }
  }
  static internal::TestTempDir* tmp_;
  static RunOutput* sync_;
};
internal::TestTempDir* AsyncCheckpointTest::tmp_ = nullptr;
RunOutput* AsyncCheckpointTest::sync_ = nullptr;

TEST_F(AsyncCheckpointTest, AsyncRunEqualsSyncRunAndEveryCheckpointVerifies) {
  ASSERT_EQ(sync_->exit_code, 0) << sync_->output;
  ASSERT_EQ(EpochLines(sync_->output).size(), 3u) << sync_->output;
  const RunOutput r = Run("async", "", "--async-checkpoint");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(EpochLines(r.output), EpochLines(sync_->output)) << r.output;
  EXPECT_THAT(r.output, HasSubstr("training blocked")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("(async: staging)")) << r.output;
  ExpectSameAsSync("async");
}

TEST_F(AsyncCheckpointTest, RankKilledMidWriteLeavesPreviousCheckpointAndResumeMatches) {
  ASSERT_EQ(sync_->exit_code, 0) << sync_->output;
  const RunOutput r = Run("crash", "TPU_DIST_TEST_ASYNC_CKPT_DIE_RANK=1", "--async-checkpoint --max-failures 1",
                          "--max-restarts 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("SIGKILL mid-write of epoch 1's checkpoint")) << r.output;
  // Epoch 2's checkpoint was never committed: the restart resumes from epoch 1's.
  EXPECT_THAT(r.output, HasSubstr("(epoch 2, step 0)")) << r.output;
  const std::vector<std::string> want = EpochLines(sync_->output), got = EpochLines(r.output);
  ASSERT_FALSE(got.empty()) << r.output;
  EXPECT_EQ(got.back(), want.back()) << r.output;
  ExpectSameAsSync("crash");
}

}  // namespace
}  // namespace tpudist::train
