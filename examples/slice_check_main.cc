// slice_check: the smallest end-to-end check of a (possibly emulated) slice. Each rank joins the job
// (distributed/job.h: coordination, a group over its store: tpu_dist, or --backend=gloo), runs a barrier and
// an all_reduce of (rank + 1) and checks W(W+1)/2: one line per rank, exit 1 on a mismatch.
//   tpurun --accelerator-type TPU-V6E --topology 4x4 --hosts-emulated -- build/examples/slice_check
// Tests: --die-rank R SIGKILLs R before the barrier (with --die-restart K only in attempt K); --stop-rank R
// SIGSTOPs R after it (the service misses its heartbeats: --heartbeat-timeout); --fail-rank R fails R with its
// own error (the others exit 75; tpurun names R as the root cause).
#include <ATen/ATen.h>
#include <signal.h>
#include <stdio.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "distributed/job.h"
#include "distributed/rank_main.h"
#include "tpu_runtime/duration_check.h"
#include "tpu_runtime/launcher/flag_names.h"

ABSL_FLAG(int, die_rank, -1, "this rank raises SIGKILL before the barrier");
ABSL_FLAG(int, die_restart, -1, "with --die-rank: die only in the attempt with this restart count (-1: every attempt)");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(60), "collective and store timeout");
ABSL_FLAG(std::string, backend, "tpu_dist", "process-group backend: tpu_dist or gloo");
ABSL_FLAG(int, numel, 8, "elements in the all_reduce tensor");
ABSL_FLAG(int, stop_rank, -1, "test: this rank raises SIGSTOP after the barrier (a hung rank)");
ABSL_FLAG(int, fail_rank, -1, "test: this rank fails with its own error after the barrier");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(10), "coordination service: a rank silent this long fails the job");

namespace tr = ::tpudist::tpu_runtime;
namespace dist = ::tpudist::distributed;

static void Signal(const tr::RankInfo& info, int sig, const char* flag) {
  printf("slice_check: %s: --%s, raising %s\n", tr::ToString(info).c_str(), flag, sig == SIGKILL ? "SIGKILL" : "SIGSTOP");
  fflush(stdout);
  raise(sig);
}

static absl::Status Check(dist::Job& job) {
  const tr::RankInfo& info = job.info();
  const int die_restart = absl::GetFlag(FLAGS_die_restart);
  if (info.rank == absl::GetFlag(FLAGS_die_rank) && (die_restart < 0 || die_restart == info.restart_count)) {
    Signal(info, SIGKILL, "die-rank");
  }
  absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> pg = job.WorldGroup();
  if (!pg.ok()) return pg.status();
  (*pg)->barrier()->wait();
  if (info.rank == absl::GetFlag(FLAGS_stop_rank)) Signal(info, SIGSTOP, "stop-rank");
  if (info.rank == absl::GetFlag(FLAGS_fail_rank)) {  // after the barrier: inside the job
    return absl::FailedPreconditionError(absl::StrCat("rank ", info.rank, ": --fail-rank: a failure of this rank's own"));
  }
  std::vector<at::Tensor> t = {at::full({absl::GetFlag(FLAGS_numel)}, info.rank + 1.0, at::kDouble)};
  (*pg)->allreduce(t)->wait();  // t[0]: [numel]
  const double expected = info.world_size * (info.world_size + 1) / 2.0, got = t[0][0].item<double>();
  const bool ok = at::all(t[0] == expected).item<bool>();
  printf("slice_check: %s %s@%s allreduce %g (expected %g) %s\n", tr::ToString(info).c_str(),
         absl::GetFlag(FLAGS_backend).c_str(), job.group_config().gloo_hostname.c_str(), got, expected,
         ok ? "OK" : "MISMATCH");
  fflush(stdout);
  return ok ? absl::OkStatus()
            : absl::InternalError(absl::StrCat("rank ", info.rank, ": allreduce gave ", got, ", expected ", expected));
}

int main(int argc, char** argv) {
  tr::launcher::NormalizedArgv args(argc, argv);  // --die-rank
  absl::ParseCommandLine(args.argc(), args.argv());
  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout), heartbeat = absl::GetFlag(FLAGS_heartbeat_timeout);
  constexpr tr::DurationRule kPositive = tr::DurationRule::kPositive;
  if (int code = dist::UsageExitCode("slice_check", {tr::CheckUserDuration("--timeout", timeout, kPositive),
                                                     tr::CheckUserDuration("--heartbeat-timeout", heartbeat, kPositive)}))
    return code;
  return dist::RunRankMain("slice_check", [&](const tr::RankInfo& info) {
    dist::JobOptions o;  // store and group options by distributed/group_config.h's one rule
    o.name = o.group.group_name = "slice_check";
    o.group.backend = absl::GetFlag(FLAGS_backend);
    o.group.timeout = timeout;
    o.heartbeat_timeout = heartbeat;
    return dist::RunJob(info, o, Check);
  });
}
