// Job: one rank's membership in a distributed job. It owns the job's
// coordination runtime (rank 0 hosts the service), the job's store, the world
// group and every group made through it, and runs the rank's work so that a
// failure reaches every rank at once and the exit code says whose it was.
//
//   JobOptions o;
//   o.name = "slice_check";              // namespace of the job's store keys
//   o.group.backend = "tpu_dist";        // or "gloo"; group.timeout bounds
//   o.group.group_name = "slice_check";  // every wait, store and startup too
//   absl::StatusOr<std::unique_ptr<Job>> job = Job::Start(info, o);
//   if (!job.ok()) return job.status();
//   return (*job)->Run([&]() -> absl::Status {
//     absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> pg = (*job)->WorldGroup();
//     if (!pg.ok()) return pg.status();
//     (*pg)->allreduce(tensors)->wait();
//     return absl::OkStatus();
//   });
//
// Exit codes travel with the status. A failure of Start or Run carries the
// exit code the rank should end with (ExitCodeOf): 1 for a failure of this
// rank's own, kPeerFailureExitCode (75, tpu_runtime/exit_codes.h) when
// another rank failed first (the job blamed it, one never registered, rank
// 0's service is gone). tpurun names a rank that exits 75 as a follower of
// the root cause (docs/runtime.md, "Launching with tpurun"). Code that adds
// context to such an error must keep its payloads (WithContext).
// RunRankMain (rank_main.h) turns the status into the process's exit status.
//
// Groups. WorldGroup() (made on first use) and every group that
// group_factory() makes belong to the job: on a job error (a peer failed,
// hung or left; the coordination client learns it within milliseconds) the
// client's error callback aborts each of them with "job failed: <error>"
// (ProcessGroupTpuDist::Abort), so a collective waiting on a dead peer fails
// at once instead of after its timeout. Shutdown() drops the job's
// references to them, then leaves the coordination service.
// The abort duty is the job's alone: there is no process-global list of
// groups (the Python binding keeps its own, for its interpreter-exit hook).
//
// Without coordination: options.group.store set (forked benchmark ranks, test
// harnesses) makes the job use that store and start no coordination runtime:
// runtime() is null, nothing is reported to other ranks, a failure exits 1.
//
// Config: group options follow distributed/group_config.h's rules, resolved
// once in Start from `info` and the process environment.
// Thread-safety: Start, Run and Shutdown from the rank's main thread;
// WorldGroup() from one thread; the factory of group_factory() and
// AbortGroups() from any thread.
#ifndef TPU_DIST_DISTRIBUTED_JOB_H_
#define TPU_DIST_DISTRIBUTED_JOB_H_

#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "distributed/group_config.h"
#include "distributed/init_process_group.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/csrc/distributed/c10d/Store.hpp"
#include "tpu_runtime/coordination/coordination_runtime.h"
#include "tpu_runtime/rank_info.h"

namespace tpudist::distributed {

struct JobOptions {
  // Namespace of the job's keys: store() is the coordination store under
  // this prefix ("" : no prefix).
  std::string name;
  // The groups' options (group_config.h). group.timeout also bounds every
  // store wait and the startup barrier of all ranks. group.store: see
  // "Without coordination" above.
  GroupInitOptions group;
  // Rank 0's coordination service fails the job when a rank sends no
  // heartbeat for this long (a hung rank).
  absl::Duration heartbeat_timeout = absl::Seconds(10);
};

// The exit code a rank's main() returns for `status`: 0 when OK, the code
// Job::Start / Job::Run attached, else 1.
int ExitCodeOf(const absl::Status& status);
// `status` carrying `exit_code` for ExitCodeOf. REQUIRES: !status.ok().
absl::Status WithExitCode(absl::Status status, int exit_code);
// `status` without that code (ToString() prints every payload).
absl::Status WithoutExitCode(absl::Status status);
// `status` with "<context>: " before its message, payloads (the exit code)
// kept. OK stays OK.
absl::Status WithContext(const absl::Status& status, absl::string_view context);

class Job {
 public:
  // Joins the job: starts or connects to its coordination runtime (all
  // ranks; waits at most options.group.timeout for every rank to register)
  // and resolves the group options. Errors carry their exit code: 75 when
  // the startup failed because of another rank.
  static absl::StatusOr<std::unique_ptr<Job>> Start(const tpu_runtime::RankInfo& info,
                                                    JobOptions options);

  ~Job();  // Shutdown()
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const tpu_runtime::RankInfo& info() const { return info_; }
  // The job's store (under options.name); shared by all ranks.
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  // The resolved group options (its given_store is store()).
  const GroupConfig& group_config() const { return config_; }
  // The coordination runtime, for ReportFailure / client(); null without
  // coordination.
  tpu_runtime::coordination::CoordinationRuntime* runtime() const { return runtime_.get(); }

  // The group of all ranks, named GroupNameFor(group_name, {0..world-1});
  // made on the first call (collective: every rank calls it), owned by the
  // job. Never null when OK.
  absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> WorldGroup();

  // NewGroup (init_process_group.h) with this job's config; each group it
  // makes belongs to the job. Same type as fsdp::DeviceMeshEnv::group_factory.
  GroupFactory group_factory() const;

  // Runs body() as this rank's work inside the job, then Shutdown(). A
  // failure (a non-OK status, or a c10::Error / std::exception escaping body,
  // which becomes Internal without its C++ backtrace) is reported to the
  // whole job first; the returned status carries the exit code (above).
  absl::Status Run(absl::FunctionRef<absl::Status()> body);

  // Aborts every live group of the job with `cause` (what the coordination
  // error callback does, prefixed "job failed: "). Returns how many.
  // REQUIRES: !cause.ok().
  int AbortGroups(const absl::Status& cause);

  // Drops the job's groups (destroyed unless the caller holds them), then
  // leaves the coordination service (rank 0 waits up to 10 s for the others
  // to leave). Idempotent; the job's groups are not aborted afterwards.
  void Shutdown();

  class Groups;  // the job's groups, shared with the error callback

 private:
  Job() = default;

  tpu_runtime::RankInfo info_;
  std::shared_ptr<Groups> groups_;
  std::unique_ptr<tpu_runtime::coordination::CoordinationRuntime> runtime_;
  c10::intrusive_ptr<c10d::Store> store_;
  GroupConfig config_;
  c10::intrusive_ptr<c10d::ProcessGroup> world_;
};

// Job::Start(info, options), then Run(body(job)): a rank's whole work in
// one job. The status carries its exit code either way.
absl::Status RunJob(const tpu_runtime::RankInfo& info, JobOptions options,
                    absl::FunctionRef<absl::Status(Job&)> body);

}  // namespace tpudist::distributed

#endif  // TPU_DIST_DISTRIBUTED_JOB_H_
