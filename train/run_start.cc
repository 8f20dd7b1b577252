#include "train/run_start.h"

#include <stdio.h>

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tpudist::train {
namespace {

constexpr char kStartKey[] = "finetune/start";

const char* KindName(StartKind k) {
  switch (k) {
    case StartKind::kFresh:
      return "fresh";
    case StartKind::kResume:
      return "resume";
    case StartKind::kFinished:
      return "finished";
  }
  return "?";
}

}  // namespace

absl::StatusOr<ResumePlan> PlanStart(const JobSpec& spec, bool resume_mismatched, int64_t batches_per_epoch,
                                     CheckpointManager& manager, MetricsLog& metrics) {
  absl::StatusOr<JobFingerprint> job = ComputeJobFingerprint(spec);
  if (!job.ok()) return job.status();
  absl::StatusOr<ResumePlan> plan =
      PlanResume(manager, {*std::move(job), resume_mismatched, spec.num_epochs, batches_per_epoch});
  if (!plan.ok()) return plan.status();
  for (const std::string& d : plan->differences) {
    fprintf(stderr, "gemma_finetune: warning: --resume-mismatched: %s\n", d.c_str());
  }
  if (plan->kind == StartKind::kFinished) return plan;
  absl::StatusOr<int64_t> dropped = metrics.TrimAfter(plan->epochs_done);
  if (!dropped.ok()) return dropped.status();
  if (*dropped > 0) {
    fprintf(stderr,
            "gemma_finetune: warning: %lld line(s) of %s are past epoch %lld (where this run continues) "
            "or unreadable; moved to %s\n",
            static_cast<long long>(*dropped), metrics.path().c_str(), static_cast<long long>(plan->epochs_done),
            kDiscardedMetricsFile);
  }
  return plan;
}

absl::StatusOr<RunStart> ShareStart(int rank, const absl::StatusOr<ResumePlan>& plan, c10d::Store& store,
                                    absl::Duration timeout) {
  if (rank == 0) {
    const std::string v =
        plan.ok() ? absl::StrCat(KindName(plan->kind), "\n", plan->checkpoint ? plan->checkpoint->path : "")
                  : absl::StrCat("error\n", plan.status().message());
    store.set(kStartKey, std::vector<uint8_t>(v.begin(), v.end()));
    if (!plan.ok()) return plan.status();
  }
  store.wait({kStartKey}, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  const std::vector<uint8_t> raw = store.get(kStartKey);
  const std::string v(raw.begin(), raw.end());
  const size_t nl = v.find('\n');
  const std::string kind = v.substr(0, nl);
  RunStart s;
  s.checkpoint = nl == std::string::npos ? "" : v.substr(nl + 1);
  if (kind == "error") return absl::FailedPreconditionError(absl::StrCat("rank 0 could not start: ", s.checkpoint));
  for (StartKind k : {StartKind::kFresh, StartKind::kResume, StartKind::kFinished}) {
    if (kind == KindName(k)) {
      s.kind = k;
      return s;
    }
  }
  return absl::InternalError(absl::StrCat("unknown start '", kind, "' under store key ", kStartKey));
}

std::optional<EpochMetrics> LoggedEpoch(const std::string& path, int64_t epoch) {
  absl::StatusOr<std::vector<EpochMetrics>> all = ReadMetricsLog(path);
  if (!all.ok()) return std::nullopt;
  for (const EpochMetrics& m : *all) {
    if (m.epoch == epoch) return m;
  }
  return std::nullopt;
}

}  // namespace tpudist::train
