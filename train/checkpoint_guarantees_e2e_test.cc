// The fine-tune's checkpoint guarantees end to end (docs/finetune.md,
// Guarantees): gemma_finetune under tpurun, 2 ranks, the tiny model, 16
// rows, 2 epochs of 4 steps. One clean run writes two checkpoints (keep
// all); each test copies its run directory, damages or reuses it, and runs
// the same job again as a fresh start (restart count 0):
//
//   - a byte flipped in a model shard, or an optimizer shard, of the newest
//     checkpoint: an error line naming the file, resume from the older one,
//     and epoch 2 ends with the clean run's loss, bit for bit;
//   - both checkpoints damaged, or the only one's checkpoint.json torn: a
//     clear error, no training, metrics.jsonl unchanged;
//   - a torn checkpoint.json on the newest: not used, the older one is;
//   - one bit of the newest checkpoint.json flipped ("epoch":1 -> 3, which
//     used to end the run as "already completed"): it fails its
//     manifest_crc32, is quarantined, and the older one is used;
//   - another --lr: refused naming the field and the two ways out;
//     --resume-mismatched with more epochs continues;
//   - the finished run again: exit 0, "already completed", no metrics line;
//   - a run directory locked by another process: fails fast naming its pid.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "train/internal/finetune_process_for_test.h"
#include "train/internal/fs_util.h"
#include "train/internal/test_temp_dir.h"
#include "train/metrics_log.h"
#include "train/run_dir_lock.h"

namespace tpudist::train {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using internal::RunOutput;

constexpr int kWorld = 2;

std::string JobArgs() {
  return "--dataset-split train[:16] --num-epochs 2 --batch-size-per-device 2 --max-seq-len 32 --lr 3e-3 "
         "--num-to-keep 0 --seed 5";
}

class CheckpointGuaranteesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new internal::TestTempDir();
    clean_ = new RunOutput(Run("clean", ""));
  }
  static void TearDownTestSuite() {
    delete clean_;
    delete tmp_;
  }
  static RunOutput Run(const std::string& run, const std::string& extra) {
    return internal::RunGemmaFinetune(
        TPURUN_PATH, GEMMA_FINETUNE_PATH, kWorld, "",
        absl::StrCat("--storage-path ", tmp_->path(), " --run-name ", run, " ", JobArgs(), " ", extra), 120);
  }
  static std::string Dir(const std::string& run) { return tmp_->path() + "/" + run; }
  // The clean run's checkpoints, oldest first.
  static std::vector<std::string> Checkpoints(const std::string& run) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(Dir(run))) {
      if (e.path().filename().string().rfind("checkpoint_", 0) == 0) out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  // A copy of the clean run under another name.
  void SetUp() override {
    ASSERT_EQ(clean_->exit_code, 0) << clean_->output;
    run_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::copy(Dir("clean"), Dir(run_), fs::copy_options::recursive);
    ckpts_ = Checkpoints(run_);
    ASSERT_EQ(ckpts_.size(), 2u);
  }
  static void FlipByte(const std::string& path) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const std::streamoff mid = f.tellg() / 2;
    char c = 0;
    f.seekg(mid);
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0xff);
    f.seekp(mid);
    f.write(&c, 1);
  }
  std::string Metrics() const {
    auto body = internal::ReadFile(Dir(run_) + "/metrics.jsonl");
    return body.ok() ? *body : "";
  }
  // Resumed from the older checkpoint: epoch 2 again, with the clean loss.
  void ExpectResumedFromOlderWithCleanLosses(const RunOutput& r) {
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("Resuming from " + ckpts_[0] + " (epoch 2, step 0)"));
    auto clean = ReadMetricsLog(Dir("clean") + "/metrics.jsonl");
    auto now = ReadMetricsLog(Dir(run_) + "/metrics.jsonl");
    ASSERT_TRUE(clean.ok() && now.ok());
    ASSERT_EQ(now->size(), 2u);  // epoch 2 replaced, not duplicated
    EXPECT_EQ((*now)[0].epoch, 1);
    EXPECT_EQ((*now)[1].epoch, 2);
    EXPECT_EQ((*now)[1].loss, (*clean)[1].loss);
  }

  static internal::TestTempDir* tmp_;
  static RunOutput* clean_;
  std::string run_;
  std::vector<std::string> ckpts_;
};
internal::TestTempDir* CheckpointGuaranteesTest::tmp_ = nullptr;
RunOutput* CheckpointGuaranteesTest::clean_ = nullptr;

TEST_F(CheckpointGuaranteesTest, FlippedModelShardFallsBackNamingTheFile) {
  const std::string bad = ckpts_[1] + "/shards/shard-1-of-2.safetensors";
  FlipByte(bad);
  RunOutput r = Run(run_, "");
  EXPECT_THAT(r.output, AllOf(HasSubstr("[checkpoint] error: checkpoint '" + ckpts_[1] + "' is corrupt"),
                              HasSubstr("checkpoint file '" + bad + "' is corrupt: crc32")));
  ExpectResumedFromOlderWithCleanLosses(r);
}

TEST_F(CheckpointGuaranteesTest, FlippedOptimizerShardFallsBackNamingTheFile) {
  const std::string bad = ckpts_[1] + "/shards/optim-0-of-2.safetensors";
  FlipByte(bad);
  RunOutput r = Run(run_, "");
  EXPECT_THAT(r.output, HasSubstr("checkpoint file '" + bad + "' is corrupt: crc32"));
  ExpectResumedFromOlderWithCleanLosses(r);
}

TEST_F(CheckpointGuaranteesTest, NoVerifiedCheckpointFailsWithoutTraining) {
  FlipByte(ckpts_[0] + "/shards/shard-0-of-2.safetensors");
  FlipByte(ckpts_[1] + "/shards/optim-1-of-2.safetensors");
  const std::string before = Metrics();
  RunOutput r = Run(run_, "");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, AllOf(HasSubstr("passes verification"), HasSubstr(ckpts_[0] + "/shards/shard-0-of-2"),
                              HasSubstr(ckpts_[1] + "/shards/optim-1-of-2"), HasSubstr("new --run-name")));
  EXPECT_THAT(r.output, Not(HasSubstr("Epoch 1/2")));
  EXPECT_EQ(Metrics(), before);
  // A restart finds them quarantined and still refuses.
  RunOutput again = Run(run_, "");
  EXPECT_NE(again.exit_code, 0);
  EXPECT_THAT(again.output, HasSubstr("found corrupt earlier"));
}

TEST_F(CheckpointGuaranteesTest, TornCheckpointJsonIsNotUsed) {
  const std::string marker = ckpts_[1] + "/checkpoint.json";
  fs::resize_file(marker, fs::file_size(marker) / 2);
  RunOutput r = Run(run_, "");
  EXPECT_THAT(r.output, HasSubstr(marker + ": bad JSON"));
  ExpectResumedFromOlderWithCleanLosses(r);
  // Torn on the only checkpoint left: an error, not a silent retrain.
  fs::remove_all(Checkpoints(run_).back());
  fs::remove_all(ckpts_[1]);
  fs::resize_file(ckpts_[0] + "/checkpoint.json", 40);
  const std::string before = Metrics();
  RunOutput only = Run(run_, "");
  EXPECT_NE(only.exit_code, 0) << only.output;
  EXPECT_THAT(only.output, HasSubstr(ckpts_[0] + "/checkpoint.json: bad JSON"));
  EXPECT_EQ(Metrics(), before);
}

// Issue 39: "epoch":1 -> "epoch":3 (one bit) in the newest checkpoint.json
// gave "Training already completed", exit 0, epoch 2 never trained.
TEST_F(CheckpointGuaranteesTest, FlippedEpochInCheckpointJsonFallsBackToOlder) {
  const std::string marker = ckpts_[1] + "/checkpoint.json";
  auto body = internal::ReadFile(marker);
  ASSERT_TRUE(body.ok()) << body.status();
  const size_t at = body->find("\"epoch\":1,");
  ASSERT_NE(at, std::string::npos) << *body;
  (*body)[at + 8] = static_cast<char>((*body)[at + 8] ^ 0x02);  // '1' -> '3'
  ASSERT_TRUE(internal::WriteFileSynced(marker, *body).ok());
  RunOutput r = Run(run_, "");
  EXPECT_THAT(r.output, Not(HasSubstr("Training already completed")));
  EXPECT_THAT(r.output, AllOf(HasSubstr("[checkpoint] error: checkpoint '" + ckpts_[1] + "' is corrupt"),
                              HasSubstr(marker + " is corrupt: its bytes have crc32")));
  ExpectResumedFromOlderWithCleanLosses(r);
  EXPECT_TRUE(fs::exists(ckpts_[1] + "/checkpoint.json.corrupt"));
}

TEST_F(CheckpointGuaranteesTest, AnotherJobIsRefusedUnlessAskedFor) {
  RunOutput r = Run(run_, "--lr 1e-3");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, AllOf(HasSubstr("holds checkpoints of a different job"),
                              HasSubstr("lr: 0.003 in the checkpoint, 0.001 now"), HasSubstr("new --run-name"),
                              HasSubstr("--resume-mismatched")));
  EXPECT_THAT(r.output, Not(HasSubstr("Epoch ")));
  // Asked for: one more epoch on top of the finished two.
  RunOutput more = Run(run_, "--num-epochs 3 --resume-mismatched");
  ASSERT_EQ(more.exit_code, 0) << more.output;
  EXPECT_THAT(more.output, HasSubstr("num_epochs: 2 in the checkpoint, 3 now"));
  EXPECT_THAT(more.output, HasSubstr("Epoch 3/3 | loss="));
  auto m = ReadMetricsLog(Dir(run_) + "/metrics.jsonl");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->size(), 3u);
}

TEST_F(CheckpointGuaranteesTest, FinishedRunSaysSoAndLogsNothing) {
  const std::string before = Metrics();
  RunOutput r = Run(run_, "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Training already completed: all 2 epochs"));
  EXPECT_THAT(r.output, HasSubstr("Final metrics (logged): {\"epoch\":2,"));
  EXPECT_THAT(r.output, Not(HasSubstr("Training completed!")));
  EXPECT_THAT(r.output, Not(HasSubstr("\"steps\":0")));
  EXPECT_THAT(r.output, Not(HasSubstr("1970-01-01")));
  EXPECT_EQ(Metrics(), before);
}

TEST_F(CheckpointGuaranteesTest, LockedRunDirFailsFastNamingTheHolder) {
  auto lock = RunDirLock::Acquire(Dir(run_), absl::ZeroDuration());
  ASSERT_TRUE(lock.ok()) << lock.status();
  const std::string before = Metrics();
  const absl::Time t0 = absl::Now();
  RunOutput r = Run(run_, "");
  EXPECT_LT(absl::Now() - t0, absl::Seconds(30));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("is in use by pid ", getpid(), " on host ")));
  EXPECT_EQ(Metrics(), before);
}

// Rank 1 is started with another --lr (as if given another config): every
// rank fails within seconds, the error names both values, and tpurun names
// rank 1 (the others stop with exit 75).
TEST_F(CheckpointGuaranteesTest, RankStartedForAnotherJobFailsEveryRankNamingBothValues) {
  const std::string wrapper = absl::StrCat(
      "sh -c 'if [ \"$RANK\" = 1 ]; then exec ", GEMMA_FINETUNE_PATH, " \"$@\" --lr 1e-2; else exec ",
      GEMMA_FINETUNE_PATH, " \"$@\"; fi' sh");
  const absl::Time t0 = absl::Now();
  RunOutput r = internal::RunGemmaFinetune(
      TPURUN_PATH, wrapper, kWorld, "",
      absl::StrCat("--storage-path ", tmp_->path(), " --run-name ", run_, "_mixed ", JobArgs()), 120);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(40));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 1 was started for another job than rank 0"));
  EXPECT_THAT(r.output, HasSubstr("lr: 0.003 on rank 0, 0.01 on rank 1"));
  EXPECT_THAT(r.output, HasSubstr("tpurun: rank 1 (host 0, local 1) failed: exit status 1"));
  // Rank 0 stops too: either it saw the job error first (its follower line)
  // or tpurun's SIGTERM, sent the moment rank 1 exited, reached it first
  // (a race of a few ms that either side can win). Never as a root cause.
  if (!absl::StrContains(r.output, "[rank 0] gemma_finetune: stopping, another rank failed")) {
    EXPECT_THAT(r.output, HasSubstr("stopping the other ranks")) << r.output;
  }
  EXPECT_THAT(r.output, Not(HasSubstr("[rank 0] gemma_finetune: error:")));
  EXPECT_THAT(r.output, Not(HasSubstr("Epoch 1")));
}

// A storage path that is a file: rank 0's error is the root cause tpurun
// reports, not rank 1's "another rank failed".
TEST_F(CheckpointGuaranteesTest, StoragePathThatIsAFileIsReportedAsRankZerosError) {
  const std::string file = tmp_->path() + "/not_a_dir";
  { std::ofstream(file) << "x"; }
  RunOutput r = internal::RunGemmaFinetune(TPURUN_PATH, GEMMA_FINETUNE_PATH, kWorld, "",
                                           absl::StrCat("--storage-path ", file, " ", JobArgs()), 120);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("tpurun: rank 0 (host 0, local 0) failed: exit status 1"));
  EXPECT_THAT(r.output, HasSubstr(file));
  EXPECT_THAT(r.output, Not(HasSubstr("tpurun: rank 1 (host 0, local 1) failed")));
}

}  // namespace
}  // namespace tpudist::train
