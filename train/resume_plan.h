// PlanResume: where an attempt of gemma_finetune starts. Rank 0 decides,
// holding the run directory's lock (run_dir_lock.h), before any rank loads
// a checkpoint; the other ranks follow its decision.
//
// The rule is the same for a fresh start (restart count 0) and for a
// restart by the launcher, because a run directory holds one job:
//
//   1. The newest checkpoint that verifies byte for byte
//      (CheckpointManager::LatestVerified; corrupt ones met on the way are
//      reported naming the bad file and quarantined). No checkpoint at all:
//      kFresh, train from --model-dir at epoch 1. Checkpoints, but none
//      that verifies: DataLoss. A damaged run is never silently restarted
//      from scratch on top of its own metrics. A file that cannot be read
//      even after retries (EIO, ...): Unavailable naming it, nothing
//      quarantined, so a later attempt resumes from the same checkpoint.
//   2. Its job fingerprint (job_fingerprint.h) must equal this attempt's.
//      Otherwise FailedPrecondition naming every differing field and the
//      two ways out: a new --run-name (start fresh) or --resume-mismatched
//      (continue from it anyway; the plan then lists the differences).
//   3. A checkpoint that already covers num_epochs epochs: kFinished, there
//      is nothing left to train. Otherwise kResume from it.
//
// Ray Train V2 behaves alike: a run restarted under the same
// RunConfig(name, storage_path) continues from its latest checkpoint.
// The caller then trims metrics.jsonl to epochs_done (MetricsLog::TrimAfter)
// so that no epoch line is ever written twice.
#ifndef TPU_DIST_TRAIN_RESUME_PLAN_H_
#define TPU_DIST_TRAIN_RESUME_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "train/checkpoint_manager.h"
#include "train/job_fingerprint.h"

namespace tpudist::train {

struct ResumeRequest {
  JobFingerprint job;           // this attempt's
  bool allow_mismatch = false;  // --resume-mismatched
  int64_t num_epochs = 1;
  int64_t batches_per_epoch = 1;  // a checkpoint at step >= this ends its epoch
};

enum class StartKind { kFresh, kResume, kFinished };

struct ResumePlan {
  StartKind kind = StartKind::kFresh;
  std::optional<CheckpointInfo> checkpoint;  // kResume, kFinished
  int64_t epochs_done = 0;                   // whole epochs in `checkpoint`
  std::vector<std::string> differences;      // accepted by allow_mismatch
  JobFingerprint job;                        // the request's: record it in new checkpoints
};

// Applies the rule above. Mutates the run dir only to quarantine corrupt
// checkpoints (call as its one writer).
absl::StatusOr<ResumePlan> PlanResume(CheckpointManager& manager,
                                      const ResumeRequest& request);

// Whole epochs done by a checkpoint written at (epoch, step), both 0-based
// as checkpoint.json records them. Pure.
int64_t EpochsDone(const CheckpointMetadata& meta, int64_t batches_per_epoch);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_RESUME_PLAN_H_
