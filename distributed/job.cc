#include "distributed/job.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "collectives/process_group_factory.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "tpu_runtime/coordination/failure_report.h"
#include "tpu_runtime/duration_check.h"

namespace tpudist::distributed {
namespace {

namespace coord = ::tpudist::tpu_runtime::coordination;

constexpr absl::string_view kExitCodePayload = "type.tpu_dist/distributed.ExitCode";

// body()'s status; an exception becomes Internal (no C++ backtrace), as in
// coordination::RunReportingFailure.
absl::Status StatusOfBody(absl::FunctionRef<absl::Status()> body) {
  try {
    return body();
  } catch (const c10::Error& e) {
    return absl::InternalError(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

}  // namespace

// The job's groups. The coordination client's error callback holds a
// reference, so it stays valid whatever the order of teardown.
class Job::Groups {
 public:
  void Add(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
    absl::MutexLock lock(&mu_);
    if (!closed_) groups_.push_back(group);
  }

  // Holds the lock while aborting (Abort only sets flags and shuts sockets
  // down), so Close() never returns while an abort is under way.
  int AbortAll(const absl::Status& cause) {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const c10::intrusive_ptr<c10d::ProcessGroup>& group : groups_) {
      if (c10::intrusive_ptr<collectives::ProcessGroupTpuDist> backend =
              collectives::TpuDistBackendOf(group)) {
        backend->Abort(cause);
        ++n;
      }
    }
    return n;
  }

  // No more groups are added or aborted; returns the job's references.
  std::vector<c10::intrusive_ptr<c10d::ProcessGroup>> Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    return std::move(groups_);
  }

 private:
  absl::Mutex mu_;
  std::vector<c10::intrusive_ptr<c10d::ProcessGroup>> groups_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

int ExitCodeOf(const absl::Status& status) {
  if (status.ok()) return 0;
  const auto payload = status.GetPayload(kExitCodePayload);  // absl::optional<absl::Cord>
  int code = 1;
  if (payload && absl::SimpleAtoi(std::string(*payload), &code) && code != 0) return code;
  return 1;
}

absl::Status WithExitCode(absl::Status status, int exit_code) {
  status.SetPayload(kExitCodePayload, absl::Cord(absl::StrCat(exit_code)));
  return status;
}

absl::Status WithoutExitCode(absl::Status status) {
  status.ErasePayload(kExitCodePayload);
  return status;
}

absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

absl::StatusOr<std::unique_ptr<Job>> Job::Start(const tpu_runtime::RankInfo& info,
                                                JobOptions options) {
  if (absl::Status s = tpu_runtime::CheckUserDuration("job timeout", options.group.timeout,
                                                      tpu_runtime::DurationRule::kPositive);
      !s.ok()) {
    return s;
  }
  std::unique_ptr<Job> job(new Job());
  job->info_ = info;
  job->groups_ = std::make_shared<Groups>();
  c10::intrusive_ptr<c10d::Store> base = options.group.store;
  if (!base) {
    coord::RuntimeOptions ro;
    ro.store_timeout =
        std::chrono::milliseconds(absl::ToInt64Milliseconds(options.group.timeout));
    ro.startup_barrier_timeout = options.group.timeout;
    ro.service.heartbeat_timeout = options.heartbeat_timeout;
    // A job error (a peer failed or hung) aborts this rank's collectives at once.
    ro.client.error_callback = [groups = job->groups_](const absl::Status& error) {
      groups->AbortAll(absl::Status(error.code(), absl::StrCat("job failed: ", error.message())));
    };
    absl::StatusOr<std::unique_ptr<coord::CoordinationRuntime>> runtime =
        coord::StartOrConnect(info, ro);
    // Another rank's failure (e.g. one that never registered) is not ours: 75.
    if (!runtime.ok()) {
      return WithExitCode(runtime.status(), coord::StartupFailureExitCode(runtime.status()));
    }
    job->runtime_ = *std::move(runtime);
    base = job->runtime_->store();
  }
  job->store_ = base;
  if (!options.name.empty()) job->store_ = c10::make_intrusive<c10d::PrefixStore>(options.name, base);
  options.group.store = job->store_;
  absl::StatusOr<GroupConfig> config = ResolveGroupConfigFromProcess(&info, options.group);
  if (!config.ok()) {
    // After the rendezvous every failure is the job's to know.
    const int code = job->runtime_ != nullptr ? job->runtime_->ReportFailure(config.status()) : 1;
    return WithExitCode(config.status(), code);
  }
  job->config_ = *std::move(config);
  return job;
}

Job::~Job() { Shutdown(); }

absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> Job::WorldGroup() {
  if (world_) return world_;
  std::vector<int> ranks(info_.world_size);
  for (int r = 0; r < info_.world_size; ++r) ranks[r] = r;
  absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> group =
      NewGroup(config_, store_, info_.rank, ranks);
  if (!group.ok()) return group.status();
  groups_->Add(*group);
  world_ = *group;
  return world_;
}

GroupFactory Job::group_factory() const {
  return [config = config_, groups = groups_](const c10::intrusive_ptr<c10d::Store>& store,
                                              int group_rank, const std::vector<int>& ranks)
             -> absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> {
    absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> group =
        NewGroup(config, store, group_rank, ranks);
    if (group.ok()) groups->Add(*group);
    return group;
  };
}

absl::Status Job::Run(absl::FunctionRef<absl::Status()> body) {
  absl::Status status;
  int exit_code = 1;
  if (runtime_ != nullptr) {
    status = coord::RunReportingFailure(*runtime_, body, &exit_code);
  } else {
    status = StatusOfBody(body);
  }
  Shutdown();
  return status.ok() ? status : WithExitCode(std::move(status), exit_code);
}

int Job::AbortGroups(const absl::Status& cause) { return groups_->AbortAll(cause); }

void Job::Shutdown() {
  if (groups_ == nullptr) return;
  world_.reset();
  // Destroyed here, outside the lock, before the coordination store goes.
  groups_->Close().clear();
  if (runtime_ != nullptr) runtime_->Shutdown();
}

absl::Status RunJob(const tpu_runtime::RankInfo& info, JobOptions options,
                    absl::FunctionRef<absl::Status(Job&)> body) {
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Start(info, std::move(options));
  if (!job.ok()) return job.status();
  return (*job)->Run([&] { return body(**job); });
}

}  // namespace tpudist::distributed
