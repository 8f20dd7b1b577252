// slice_check: the smallest end-to-end check of a (possibly emulated) slice.
// Each rank discovers who it is from its environment, joins the job's
// coordination service, builds a process group over the coordination store
// (tpu_dist by default: shm inside a host, TCP between hosts; --backend=gloo
// for ProcessGroupGloo), runs a barrier and an all_reduce of (rank + 1), and
// checks the sum against W(W+1)/2. One line per rank; exit status 1 on any
// mismatch/error. Without the collectives folder in the build only gloo is
// available.
//
//   tpurun --accelerator-type TPU-V6E --topology 4x4 --hosts-emulated --
//       build/examples/slice_check
//
// --die-rank R makes rank R SIGKILL itself before the barrier (to check that
// the launcher notices and stops the others); with --die-restart K only in
// the attempt whose restart count is K (to check tpurun --max-restarts).
// --stop-rank R makes rank R SIGSTOP itself after the barrier (hung, not
// dead: the others wait in the all_reduce until the coordination service
// misses R's heartbeats, --heartbeat-timeout, and aborts them); --fail-rank R
// makes rank R fail with an error of its own after the barrier (the others
// stop with exit 75, and the launcher names R as the root cause).
#include <ATen/ATen.h>
#include <signal.h>
#include <stdio.h>

#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/group_registry.h"
#include "distributed/init_process_group.h"
#include "tpu_runtime/coordination/coordination_runtime.h"
#include "tpu_runtime/coordination/failure_report.h"
#include "tpu_runtime/duration_check.h"
#include "tpu_runtime/env_discovery.h"
#include "tpu_runtime/exit_codes.h"
#include "tpu_runtime/launcher/flag_names.h"
#include "tpu_runtime/rank_info.h"

ABSL_FLAG(int, die_rank, -1, "this rank raises SIGKILL before the barrier");
ABSL_FLAG(int, die_restart, -1,
          "with --die-rank: die only in the attempt with this restart count (-1: every attempt)");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(60), "collective and store timeout");
ABSL_FLAG(std::string, backend, "tpu_dist", "process-group backend: tpu_dist or gloo");
ABSL_FLAG(int, numel, 8, "elements in the all_reduce tensor");
ABSL_FLAG(int, stop_rank, -1, "test: this rank raises SIGSTOP after the barrier (a hung rank)");
ABSL_FLAG(int, fail_rank, -1, "test: this rank fails with its own error after the barrier");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(10),
          "coordination service: a rank silent this long fails the job");

namespace tpudist::examples {
namespace {

namespace tr = ::tpudist::tpu_runtime;

// The check proper, inside the job's coordination runtime.
absl::Status CheckWithRuntime(const tr::RankInfo& info,
                              tr::coordination::CoordinationRuntime& coord) {
  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
  const int die_restart = absl::GetFlag(FLAGS_die_restart);
  if (info.rank == absl::GetFlag(FLAGS_die_rank) &&
      (die_restart < 0 || die_restart == info.restart_count)) {
    printf("slice_check: %s: --die-rank, raising SIGKILL\n", tr::ToString(info).c_str());
    fflush(stdout);
    raise(SIGKILL);
  }

  // The store, host id, bind address, job id/secret and group name follow
  // the one rule of distributed/group_config.h.
  namespace dist = ::tpudist::distributed;
  dist::GroupInitOptions options;
  options.backend = absl::GetFlag(FLAGS_backend);
  options.group_name = "slice_check";
  options.timeout = timeout;
  options.store = c10::make_intrusive<c10d::PrefixStore>("slice_check", coord.store());
  absl::StatusOr<dist::InitializedGroup> group = dist::InitProcessGroup(info, options);
  if (!group.ok()) return group.status();
  const std::string& backend = options.backend;
  c10::intrusive_ptr<c10d::ProcessGroup> pg = std::move(group->group);
  pg->barrier()->wait();
  if (info.rank == absl::GetFlag(FLAGS_stop_rank)) {
    printf("slice_check: %s: --stop-rank, raising SIGSTOP\n", tr::ToString(info).c_str());
    fflush(stdout);
    raise(SIGSTOP);
  }
  if (info.rank == absl::GetFlag(FLAGS_fail_rank)) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", info.rank, ": --fail-rank: a failure of this rank's own"));
  }

  const int64_t numel = absl::GetFlag(FLAGS_numel);
  std::vector<at::Tensor> tensors = {
      at::full({numel}, static_cast<double>(info.rank + 1), at::kDouble)};  // [numel]
  pg->allreduce(tensors)->wait();
  const double expected = info.world_size * (info.world_size + 1) / 2.0;
  const at::Tensor& sum = tensors[0];  // [numel]
  const bool ok = at::all(sum == expected).item<bool>();
  printf("slice_check: %s %s@%s allreduce %g (expected %g) %s\n", tr::ToString(info).c_str(),
         backend.c_str(), group->config.gloo_hostname.c_str(), sum[0].item<double>(), expected,
         ok ? "OK" : "MISMATCH");
  fflush(stdout);
  pg.reset();
  coord.Shutdown();
  if (!ok) {
    return absl::InternalError(absl::StrCat("rank ", info.rank, ": allreduce gave ",
                                            sum[0].item<double>(), ", expected ", expected));
  }
  return absl::OkStatus();
}

absl::Status Check(const tr::RankInfo& info, int* exit_code) {
  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
  const auto timeout_ms = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  tr::coordination::RuntimeOptions runtime_options;
  runtime_options.store_timeout = timeout_ms;
  runtime_options.startup_barrier_timeout = timeout;
  runtime_options.service.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  // A job error (a peer failed or hung) aborts this rank's collectives at once.
  runtime_options.client.error_callback = ::tpudist::collectives::AbortAllGroupsCallback();
  absl::StatusOr<std::unique_ptr<tr::coordination::CoordinationRuntime>> coord =
      tr::coordination::StartOrConnect(info, runtime_options);
  if (!coord.ok()) {
    // Another rank's failure (e.g. one that never registered) is not ours: 75.
    *exit_code = tr::coordination::StartupFailureExitCode(coord.status());
    return coord.status();
  }
  // After the rendezvous a failure is reported to the whole job; the exit
  // code tells the launcher whether it was this rank's own.
  return tr::coordination::RunReportingFailure(
      **coord, [&] { return CheckWithRuntime(info, **coord); }, exit_code);
}

}  // namespace
}  // namespace tpudist::examples

int main(int argc, char** argv) {
  tpudist::tpu_runtime::launcher::NormalizedArgv args(argc, argv);  // --die-rank
  absl::ParseCommandLine(args.argc(), args.argv());
  namespace tr = ::tpudist::tpu_runtime;
  for (absl::Status s :
       {tr::CheckUserDuration("--timeout", absl::GetFlag(FLAGS_timeout), tr::DurationRule::kPositive),
        tr::CheckUserDuration("--heartbeat-timeout", absl::GetFlag(FLAGS_heartbeat_timeout),
                              tr::DurationRule::kPositive)}) {
    if (!s.ok()) {
      fprintf(stderr, "slice_check: usage error: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  absl::StatusOr<tr::RankInfo> info = tr::DiscoverRankInfo(tr::EnvMapFromProcess());
  if (!info.ok()) {
    fprintf(stderr, "slice_check: discovery failed: %s\n", info.status().ToString().c_str());
    return 1;
  }
  absl::Status status;
  int exit_code = 1;
  try {
    status = tpudist::examples::Check(*info, &exit_code);
  } catch (const c10::Error& e) {  // torch's checks: the message, not the C++ backtrace
    status = absl::InternalError(e.what_without_backtrace());
  } catch (const std::exception& e) {  // c10d reports failures as exceptions
    status = absl::InternalError(e.what());
  }
  if (!status.ok()) {
    fprintf(stderr, "slice_check: rank %d %s: %s\n", info->rank,
            exit_code == tr::kPeerFailureExitCode ? "stopping, another rank failed" : "failed",
            status.ToString().c_str());
    return exit_code;
  }
  return 0;
}
