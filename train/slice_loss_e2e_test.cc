// Losing a slice (issue 32 item 5), end to end: gemma_finetune on two
// emulated v6e 2x1 slices (tpurun --num-slices 2 --hosts-emulated, 2 ranks
// per slice, 4 in all) with --max-failures 1. Both ranks of slice 1 SIGKILL
// themselves before step 3 of epoch 2 (after the epoch-1 checkpoint,
// --die-slice 1). tpurun names slice 1 as lost, restarts every rank with a
// freshly planned environment (MEGASCALE_* included), the run resumes from
// the epoch-1 checkpoint and ends with the epoch losses of an uninterrupted
// run of the same settings, exactly, and exit 0. The test prints the time
// from the failure to the stop, and from the restart to the resume and to the
// first progress line. Every child runs under `timeout`, so a hang fails it.
#include <stdio.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "train/internal/test_temp_dir.h"
#include "train/metrics_log.h"

namespace tpudist::train {
namespace {

using ::testing::HasSubstr;

struct TimedRun {
  int exit_code = -1;
  std::string output;
  std::vector<std::pair<absl::Time, std::string>> lines;  // arrival time of each line

  // When the first line containing `text` (after line `from`) arrived; its index in *at.
  absl::Time When(const std::string& text, size_t from = 0, size_t* at = nullptr) const {
    for (size_t i = from; i < lines.size(); ++i) {
      if (absl::StrContains(lines[i].second, text)) {
        if (at != nullptr) *at = i;
        return lines[i].first;
      }
    }
    return absl::InfiniteFuture();
  }
};

// gemma_finetune on 2 emulated v6e 2x1 slices under tpurun --max-restarts 1.
TimedRun RunTwoSlices(const std::string& storage, const std::string& run, const std::string& extra) {
  const std::string cmd = absl::StrCat(
      "OMP_NUM_THREADS=1 timeout -s KILL 300 ", TPURUN_PATH,
      " --accelerator-type v6e --topology 2x1 --hosts-emulated --num-slices 2 --max-restarts 1 -- ",
      GEMMA_FINETUNE_PATH, " --timeout 120s --storage-path ", storage, " --run-name ", run,
      " --dataset-split train[:128] --num-epochs 2 --batch-size-per-device 4 --max-seq-len 64",
      " --lr 3e-3 --num-to-keep 1 --seed 5 --max-failures 1 ", extra, " 2>&1");
  TimedRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[8192];
  while (fgets(buf, sizeof(buf), p) != nullptr) {
    r.lines.emplace_back(absl::Now(), buf);
    r.output += buf;
  }
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

TEST(SliceLossE2eTest, LostSliceIsNamedRestartedAndResumesToTheSameLosses) {
  const internal::TestTempDir tmp;
  TimedRun clean = RunTwoSlices(tmp.path(), "clean", "");
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  TimedRun killed = RunTwoSlices(tmp.path(), "killed", "--die-slice 1 --die-epoch 1 --die-step 3");
  ASSERT_EQ(killed.exit_code, 0) << killed.output;

  EXPECT_THAT(killed.output, HasSubstr("rank 2: --die-slice at epoch 1 step 3, raising SIGKILL"));
  EXPECT_THAT(killed.output, HasSubstr("rank 3: --die-slice at epoch 1 step 3, raising SIGKILL"));
  EXPECT_THAT(killed.output, HasSubstr("tpurun: slice 1 (ranks 2-3, host 127.0.2.1) lost: all 2 of its "
                                       "ranks failed before tpurun stopped the job\n"));
  EXPECT_THAT(killed.output, ::testing::Not(HasSubstr("tpurun: slice 0 (")));
  EXPECT_THAT(killed.output, HasSubstr("tpurun: restarting all ranks (restart 1 of 1)"));
  EXPECT_THAT(killed.output, HasSubstr("tpurun: all 4 ranks succeeded in"));
  EXPECT_THAT(killed.output, HasSubstr("(epoch 2, step 0)"));  // the epoch-1 checkpoint
  EXPECT_THAT(clean.output, ::testing::Not(HasSubstr("lost:")));

  absl::StatusOr<std::vector<EpochMetrics>> c = ReadMetricsLog(tmp.path() + "/clean/metrics.jsonl");
  absl::StatusOr<std::vector<EpochMetrics>> k = ReadMetricsLog(tmp.path() + "/killed/metrics.jsonl");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_EQ(c->size(), 2u);
  ASSERT_EQ(k->size(), 2u);
  for (size_t e = 0; e < 2; ++e) EXPECT_EQ((*k)[e].loss, (*c)[e].loss) << "epoch " << e + 1;

  // What the loss costs, in time (printed for docs/runtime.md).
  size_t restart_line = 0;
  const absl::Time died = killed.When("raising SIGKILL");
  const absl::Time stopped = killed.When("tpurun: all ranks stopped");
  const absl::Time restarted = killed.When("tpurun: restarting all ranks", 0, &restart_line);
  const absl::Time resumed = killed.When("Resuming from ", restart_line);
  const absl::Time first_progress = killed.When("Epoch 2/2 step", restart_line);
  ASSERT_LT(first_progress, absl::InfiniteFuture()) << killed.output;
  printf("slice loss: kill -> all ranks stopped %.0f ms; restart -> resumed from checkpoint %.0f ms; "
         "restart -> first progress line (2 steps) %.0f ms; clean run %.1f s, killed run %.1f s\n",
         Ms(stopped - died), Ms(resumed - restarted), Ms(first_progress - restarted),
         Ms(clean.lines.back().first - clean.lines.front().first) / 1000,
         Ms(killed.lines.back().first - killed.lines.front().first) / 1000);
}

}  // namespace
}  // namespace tpudist::train
