#include "train/resume_plan.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tpudist::train {

int64_t EpochsDone(const CheckpointMetadata& meta, int64_t batches_per_epoch) {
  return meta.epoch + (meta.step >= batches_per_epoch ? 1 : 0);
}

absl::StatusOr<ResumePlan> PlanResume(CheckpointManager& manager,
                                      const ResumeRequest& request) {
  absl::StatusOr<std::optional<CheckpointInfo>> latest = manager.LatestVerified();
  if (!latest.ok()) {
    const absl::Status& st = latest.status();
    if (IsCheckpointIoError(st)) {
      return absl::Status(st.code(),
                          absl::StrCat(st.message(),
                                       ". Not training: check the storage (dmesg, the filesystem's "
                                       "health) and run again; the next attempt resumes from the "
                                       "same checkpoint"));
    }
    if (!absl::IsDataLoss(st)) return st;
    return absl::Status(
        st.code(),
        absl::StrCat(st.message(),
                     ". Refusing to train this run from scratch on top of it: use a new "
                     "--run-name to start over, or move the corrupt checkpoint directories away"));
  }
  ResumePlan plan;
  plan.job = request.job;
  if (!latest->has_value()) return plan;
  const CheckpointInfo& c = **latest;
  plan.differences = FingerprintDifferences(c.metadata.job, request.job);
  if (!plan.differences.empty() && !request.allow_mismatch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run directory '", manager.run_dir(), "' holds checkpoints of a different job (newest: '",
        c.path, "'): ", absl::StrJoin(plan.differences, "; "),
        ". To start fresh, use a new --run-name; to continue from that checkpoint anyway, add "
        "--resume-mismatched"));
  }
  plan.checkpoint = c;
  plan.epochs_done = EpochsDone(c.metadata, request.batches_per_epoch);
  plan.kind = plan.epochs_done >= request.num_epochs ? StartKind::kFinished : StartKind::kResume;
  return plan;
}

}  // namespace tpudist::train
