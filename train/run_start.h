// How an attempt of gemma_finetune starts, agreed by all ranks before any
// of them loads a model or a checkpoint:
//
//   rank 0 (holding the run-dir lock, run_dir_lock.h)
//     PlanStart: fingerprint this job (job_fingerprint.h), PlanResume
//     (resume_plan.h: newest verified checkpoint of the same job, or fresh,
//     or finished, or an error), then metrics.jsonl trimmed to the epochs
//     that checkpoint holds (MetricsLog::TrimAfter), warnings on stderr
//   every rank
//     ShareStart: rank 0 publishes "<kind>\n<checkpoint path>" (or
//     "error\n<text>") under one store key; the others wait for it (up to
//     `timeout`), so that rank 0's refusal ends every rank at once with its
//     reason instead of a store timeout.
//
// Call once per attempt, from one thread.
#ifndef TPU_DIST_TRAIN_RUN_START_H_
#define TPU_DIST_TRAIN_RUN_START_H_

#include <cstdint>
#include <optional>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "train/checkpoint_manager.h"
#include "train/job_fingerprint.h"
#include "train/metrics_log.h"
#include "train/resume_plan.h"

namespace tpudist::train {

// What every rank learns.
struct RunStart {
  StartKind kind = StartKind::kFresh;
  std::string checkpoint;  // kResume, kFinished: the directory to use
};

// Rank 0 only (see above). Errors name the file or the differing fields.
absl::StatusOr<ResumePlan> PlanStart(const JobSpec& spec, bool resume_mismatched, int64_t batches_per_epoch,
                                     CheckpointManager& manager, MetricsLog& metrics);

// Every rank; `plan` is read on rank 0 only (its error is returned there
// as is, and as FailedPrecondition "rank 0 could not start: ..." on the
// others).
absl::StatusOr<RunStart> ShareStart(int rank, const absl::StatusOr<ResumePlan>& plan, c10d::Store& store,
                                    absl::Duration timeout);

// The line of `epoch` (1-based) in the metrics.jsonl at `path`; nullopt if
// absent or the file does not parse.
std::optional<EpochMetrics> LoggedEpoch(const std::string& path, int64_t epoch);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_RUN_START_H_
