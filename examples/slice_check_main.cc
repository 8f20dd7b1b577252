// slice_check: the smallest end-to-end check of a (possibly emulated) slice. Each rank joins the job
// (distributed/job.h: coordination, a group over its store: tpu_dist, or --backend=gloo), runs a barrier and
// an all_reduce of (rank + 1) and checks W(W+1)/2: one line per rank, exit 1 on a mismatch.
//   tpurun --accelerator-type TPU-V6E --topology 4x4 --hosts-emulated -- build/examples/slice_check
// Tests: --die-rank R SIGKILLs R before the barrier (with --die-restart K only in attempt K); --stop-rank R
// SIGSTOPs R after it (the service misses its heartbeats: --heartbeat-timeout); --fail-rank R fails R with its
// own error (the others exit 75; tpurun names R as the root cause). --gloo-parity: after the check, the
// tpu_dist all_reduce / reduce_scatter / all_gather of the world and of the groups of equal in-slice position
// (spanning every slice: the DCN path) against Gloo's, fp32 and bf16, sizes not divisible by the slice size.
#include <ATen/ATen.h>
#include <signal.h>
#include <stdio.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "distributed/init_process_group.h"
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
ABSL_FLAG(bool, gloo_parity, false, "compare tpu_dist's reductions with Gloo's over the world and cross-slice groups");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(10), "coordination service: a rank silent this long fails the job");

namespace tr = ::tpudist::tpu_runtime;
namespace dist = ::tpudist::distributed;

static void Signal(const tr::RankInfo& info, int sig, const char* flag) {
  printf("slice_check: %s: --%s, raising %s\n", tr::ToString(info).c_str(), flag, sig == SIGKILL ? "SIGKILL" : "SIGSTOP");
  fflush(stdout);
  raise(sig);
}

// Small integers: sums exact in bf16 over <= 32 ranks.
static at::Tensor Input(int rank, int64_t n, at::ScalarType type, int salt) {
  return ((at::arange(n, at::kLong) * 7 + rank * 13 + salt) % 11 - 5).to(type);
}

// tpu_dist vs Gloo over the same members (group rank `me` of `ranks`): "" or the first mismatch;
static std::string Parity(dist::Job& job, const std::vector<int>& ranks, int me) {
  dist::GroupConfig ours = job.group_config(), gloo = job.group_config();
  ours.group_name = "parity_td";
  gloo.group_name = "parity_gloo";
  gloo.backend = dist::BackendKind::kGloo;
  auto a = dist::NewGroup(ours, job.store(), me, ranks);
  auto b = dist::NewGroup(gloo, job.store(), me, ranks);
  if (!a.ok()) return std::string(a.status().message());
  if (!b.ok()) return std::string(b.status().message());
  const int w = static_cast<int>(ranks.size());
  for (at::ScalarType type : {at::kFloat, at::kBFloat16}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}, int64_t{65539}}) {
      const std::string what = absl::StrCat(c10::toString(type), " n=", n);
      for (auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::AVG}) {
        std::vector<at::Tensor> x = {Input(me, n, type, 0)}, y = {x[0].clone()};
        c10d::AllreduceOptions ao, go;
        ao.reduceOp = op;
        (*a)->allreduce(x, ao)->wait();
        (*b)->allreduce(y, go)->wait();  // Gloo has no AVG: SUM / W
        if (op == c10d::ReduceOp::AVG) y[0] = (y[0].to(at::kFloat) / w).to(type);
        if (!at::equal(x[0], y[0])) return absl::StrCat("allreduce ", int(op), " ", what);
      }
      at::Tensor full = Input(me, w * n, type, 3), out = at::empty({n}, type);
      (*a)->_reduce_scatter_base(out, full)->wait();
      std::vector<at::Tensor> y = {full.clone()};
      (*b)->allreduce(y)->wait();
      if (!at::equal(out, y[0].narrow(0, me * n, n))) return "reduce_scatter " + what;
      at::Tensor in = Input(me, n, type, 5), ga = at::empty({w * n}, type), gb = at::empty({w * n}, type);
      (*a)->_allgather_base(ga, in)->wait();
      (*b)->_allgather_base(gb, in)->wait();
      if (!at::equal(ga, gb)) return "allgather " + what;
    }
  }
  return "";
}

static absl::Status GlooParity(dist::Job& job) {
  const tr::RankInfo& info = job.info();
  std::vector<int> world(info.world_size), across;
  for (int r = 0; r < info.world_size; ++r) world[r] = r;
  const int per_slice = info.devices_per_slice(), pos = info.rank % per_slice;
  for (int s = 0; s < info.num_slices; ++s) across.push_back(s * per_slice + pos);
  std::string bad = Parity(job, world, info.rank);
  if (bad.empty()) bad = Parity(job, across, info.slice_index);
  printf("slice_check: rank %d gloo parity (world, position %d across %d slices): %s\n", info.rank, pos,
         info.num_slices, (bad.empty() ? std::string("OK") : "MISMATCH " + bad).c_str());
  fflush(stdout);
  return bad.empty() ? absl::OkStatus() : absl::InternalError(absl::StrCat("rank ", info.rank, ": ", bad));
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
  if (ok && absl::GetFlag(FLAGS_gloo_parity)) return GlooParity(job);
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
