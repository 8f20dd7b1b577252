// ffn_tp_check: DTensor tensor-parallel parity of a feed-forward block on
// every rank of a (possibly emulated) slice, then an all_reduce check.
//
//   tpurun --accelerator-type TPU-V6E --topology 4x4 --hosts-emulated --
//       build/examples/ffn_tp_check [--backend gloo]
//
// --backend gloo runs the same check over Gloo (a comparison point); the
// default tpu_dist group spans the emulated hosts (shm inside, TCP between).
//
// Each rank: seed 42, builds FeedForward(hidden) = x + w2(SiLU(w1(x))) (no
// bias) and computes it on one device (the reference, forward + backward);
// builds the same model again, applies the plan {w1: ColwiseParallel, w2:
// RowwiseParallel} over a 1-D DeviceMesh of all ranks on the tpu_dist
// backend (rendezvous through the coordination store, StartOrConnect), runs
// forward + backward, and compares output, input grad and the w1/w2 grad
// shards with the reference (rtol 1e-3, atol 1e-2). Then all-reduces a
// tensor of 4 x (rank + 1) and checks the sum W(W+1)/2. Rank 0 prints one
// line per rank in rank order and a summary; exit status 1 on any mismatch.
//
// --wrong-style (for the negative test) leaves w2's output Partial, i.e.
// skips the all-reduce TP needs: parity must then fail.
#include <stdio.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/nn/module.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "collectives/group_registry.h"
#include "distributed/init_process_group.h"
#include "fsdp/device_mesh.h"
#include "fsdp/parallelize_module.h"
#include "fsdp/tensor_parallel.h"
#include "nn/layers.h"
#include "tpu_runtime/coordination/coordination_runtime.h"
#include "tpu_runtime/coordination/failure_report.h"
#include "tpu_runtime/duration_check.h"
#include "tpu_runtime/env_discovery.h"
#include "tpu_runtime/exit_codes.h"
#include "tpu_runtime/launcher/flag_names.h"
#include "tpu_runtime/rank_info.h"
#include "tpu_runtime/slice_env.h"

ABSL_FLAG(std::string, topology, "", "expected slice topology (e.g. 4x4); empty: as discovered");
ABSL_FLAG(std::string, accelerator_type, "",
          "expected accelerator type (e.g. TPU-V6E); empty: as discovered");
ABSL_FLAG(int64_t, batch_size, 4, "rows of the input");
ABSL_FLAG(int64_t, hidden_dim, 64, "FeedForward hidden size (w1: hidden -> 4*hidden)");
ABSL_FLAG(bool, wrong_style, false, "negative test: leave w2's output Partial (must fail)");
ABSL_FLAG(std::string, backend, "tpu_dist",
          "process-group backend: tpu_dist (default) or gloo");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(120), "store and collective timeout");

namespace tpudist::examples {
namespace {

namespace tr = ::tpudist::tpu_runtime;
namespace fsdp = ::tpudist::fsdp;

// FeedForward(hidden) = x + w2(SiLU(w1(x))), no bias. Model code: no
// distributed calls; nn::Linear computes torch::nn::Linear's numbers until a
// plan registers tensor-parallel hooks on it.
struct FeedForwardImpl : torch::nn::Module {
  explicit FeedForwardImpl(int64_t hidden)
      : w1(register_module("w1", nn::Linear(hidden, 4 * hidden, /*bias=*/false))),
        w2(register_module("w2", nn::Linear(4 * hidden, hidden, /*bias=*/false))) {}
  at::Tensor forward(const at::Tensor& x) { return x + w2(at::silu(w1(x))); }  // [batch, hidden]
  nn::Linear w1{nullptr}, w2{nullptr};
};
TORCH_MODULE(FeedForward);

struct FfnRun {
  at::Tensor y;        // [batch, hidden]
  at::Tensor x_grad;   // [batch, hidden]
  at::Tensor w1_grad;  // [4*hidden (local shard), hidden]
  at::Tensor w2_grad;  // [hidden, 4*hidden (local shard)]
};

// Seed 42, then the model and input in a fixed order: identical on all ranks.
FfnRun Run(int64_t batch, int64_t hidden, const fsdp::DeviceMesh* mesh, bool wrong_style,
           absl::Status* status) {
  at::manual_seed(42);
  FeedForward ffn(hidden);
  at::Tensor x = at::randn({batch, hidden}).requires_grad_(true);  // [batch, hidden]
  at::Tensor g = at::randn({batch, hidden});                       // dL/dy
  if (mesh != nullptr) {
    fsdp::RowwiseParallelOptions row;
    if (wrong_style) row.output_layout = fsdp::Placement::Partial();
    *status = fsdp::ParallelizeModule(
        ffn.ptr(), *mesh, {{"w1", fsdp::ColwiseParallel()}, {"w2", fsdp::RowwiseParallel(row)}});
    if (!status->ok()) return {};
  }
  at::Tensor y = ffn(x);
  (y * g).sum().backward();
  auto params = ffn->named_parameters();
  return {y.detach(), x.grad(), params["w1.weight"].grad(), params["w2.weight"].grad()};
}

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b, bool* ok) {
  if (a.sizes() != b.sizes()) {
    *ok = false;
    return INFINITY;
  }
  *ok = *ok && at::allclose(a, b, 1e-3, 1e-2);
  return a.numel() == 0 ? 0.0 : (a - b).abs().max().item<double>();
}

std::string Hostname(const tr::RankInfo& info) {
  if (info.host_index >= 0 && info.host_index < static_cast<int>(info.hostnames.size())) {
    return info.hostnames[info.host_index];
  }
  return info.master_addr;
}

// The check proper, inside the job's coordination runtime.
absl::Status CheckWithRuntime(const tr::RankInfo& info,
                              tr::coordination::CoordinationRuntime& coord) {
  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
  const auto timeout_ms = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  auto store = c10::make_intrusive<c10d::PrefixStore>("ffn_tp_check", coord.store());

  fsdp::DeviceMeshEnv env;
  env.rank = info.rank;
  env.world_size = info.world_size;
  env.store = store;
  env.mesh_name = "tp_mesh";
  env.collective_timeout = timeout;
  const std::string backend = absl::GetFlag(FLAGS_backend);
  // Group options (host id, bind address, job id/secret, names) by the one
  // rule of distributed/group_config.h.
  distributed::GroupInitOptions group_options;
  group_options.backend = backend;
  group_options.group_name = "ffn_tp";
  group_options.timeout = timeout;
  absl::StatusOr<distributed::GroupConfig> group_config =
      distributed::ResolveGroupConfigFromProcess(&info, group_options);
  if (!group_config.ok()) return group_config.status();
  env.group_factory = distributed::MakeGroupFactory(*group_config);
  absl::StatusOr<fsdp::DeviceMesh> mesh =
      fsdp::InitDeviceMesh("tpu", {info.world_size}, {"tp"}, env);
  if (!mesh.ok()) return mesh.status();
  const int n = info.world_size;

  const int64_t batch = absl::GetFlag(FLAGS_batch_size);
  const int64_t hidden = absl::GetFlag(FLAGS_hidden_dim);
  absl::Status status;
  const FfnRun ref = Run(batch, hidden, nullptr, false, &status);
  const FfnRun tp = Run(batch, hidden, &*mesh, absl::GetFlag(FLAGS_wrong_style), &status);
  if (!status.ok()) return status;
  bool ok = true;
  double diff = MaxAbsDiff(tp.y, ref.y, &ok);
  diff = std::max(diff, MaxAbsDiff(tp.x_grad, ref.x_grad, &ok));
  diff = std::max(diff, MaxAbsDiff(tp.w1_grad, ref.w1_grad.chunk(n, 0)[info.rank], &ok));
  diff = std::max(diff, MaxAbsDiff(tp.w2_grad, ref.w2_grad.chunk(n, 1)[info.rank], &ok));

  // all_reduce of 4 x (rank + 1) on the same tpu_dist group.
  const c10::intrusive_ptr<c10d::ProcessGroup>& pg = mesh->Group(0);
  std::vector<at::Tensor> sum = {at::full({4}, static_cast<float>(info.rank + 1))};  // [4]
  pg->allreduce(sum)->wait(timeout_ms);
  const double expected = n * (n + 1) / 2.0;
  const bool sum_ok = at::all(sum[0] == expected).item<bool>();
  // Job-wide verdict and worst diff.
  std::vector<at::Tensor> verdict = {at::tensor({(ok && sum_ok) ? 1.0 : 0.0, -diff})};  // [2]
  c10d::AllreduceOptions min_opts;
  min_opts.reduceOp = c10d::ReduceOp::MIN;
  pg->allreduce(verdict, min_opts)->wait(timeout_ms);
  const bool all_ok = verdict[0][0].item<double>() == 1.0;
  const double max_diff = -verdict[0][1].item<double>();

  const std::string line = absl::StrFormat(
      "Rank %2d (worker_id=%d, local_rank=%d, ip=%s): all_reduce_sum=[%s]%s", info.rank,
      info.host_index, info.local_rank, Hostname(info),
      absl::StrJoin(std::vector<std::string>(4, absl::StrFormat("%.1f", sum[0][0].item<float>())),
                    ", "),
      ok ? "" : absl::StrFormat(" TP MISMATCH (max_abs_diff=%g)", diff));
  store->set(absl::StrCat("line/", info.rank), std::vector<uint8_t>(line.begin(), line.end()));
  if (info.rank == 0) {
    for (int r = 0; r < n; ++r) {
      const std::string key = absl::StrCat("line/", r);
      store->wait({key}, timeout_ms);
      const std::vector<uint8_t> v = store->get(key);
      printf("%s\n", std::string(v.begin(), v.end()).c_str());
    }
    if (all_ok) {
      printf("All %d %s ranks verified DTensor TP parity (max_abs_diff=%.3g) and "
             "all_reduce sum = %.1f\n", n, backend.c_str(), max_diff, expected);
    } else {
      printf("FAILED: DTensor TP parity or all_reduce mismatch on some rank "
             "(max_abs_diff=%.3g, expected sum %.1f)\n", max_diff, expected);
    }
    fflush(stdout);
  }
  pg->barrier()->wait(timeout_ms);  // rank 0 has read every line
  coord.Shutdown();
  if (!all_ok) {
    return absl::InternalError(absl::StrCat("rank ", info.rank, ": parity ", ok ? "ok" : "MISMATCH",
                                            " (max_abs_diff ", diff, "), all_reduce ",
                                            sum_ok ? "ok" : "MISMATCH", "; job verdict: failed"));
  }
  return absl::OkStatus();
}

absl::Status Check(const tr::RankInfo& info, int* exit_code) {
  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
  const auto timeout_ms = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  if (!absl::GetFlag(FLAGS_topology).empty() || !absl::GetFlag(FLAGS_accelerator_type).empty()) {
    absl::StatusOr<tr::SliceSpec> want = tr::SliceSpecFromFlags(
        absl::GetFlag(FLAGS_accelerator_type).empty() ? info.slice.accelerator_type
                                                       : absl::GetFlag(FLAGS_accelerator_type),
        absl::GetFlag(FLAGS_topology));
    if (!want.ok()) return want.status();
    if (want->num_devices() != info.world_size) {
      return absl::FailedPreconditionError(
          absl::StrCat("--topology gives ", want->num_devices(), " devices but the job has ",
                       info.world_size, " ranks"));
    }
  }
  tr::coordination::RuntimeOptions runtime_options;
  runtime_options.store_timeout = timeout_ms;
  runtime_options.startup_barrier_timeout = timeout;
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
  tpudist::tpu_runtime::launcher::NormalizedArgv args(argc, argv);  // --hidden-dim etc.
  absl::ParseCommandLine(args.argc(), args.argv());
  namespace tr = ::tpudist::tpu_runtime;
  if (absl::Status s = tr::CheckUserDuration("--timeout", absl::GetFlag(FLAGS_timeout),
                                             tr::DurationRule::kPositive);
      !s.ok()) {
    fprintf(stderr, "ffn_tp_check: usage error: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  absl::StatusOr<tr::RankInfo> info = tr::DiscoverRankInfo(tr::EnvMapFromProcess());
  if (!info.ok()) {
    fprintf(stderr, "ffn_tp_check: discovery failed: %s\n", info.status().ToString().c_str());
    return 1;
  }
  absl::Status status;
  int exit_code = 1;
  try {
    status = tpudist::examples::Check(*info, &exit_code);
  } catch (const c10::Error& e) {  // torch's checks: the message, not the C++ backtrace
    status = absl::InternalError(e.what_without_backtrace());
  } catch (const std::exception& e) {  // c10d and module forward report failures as exceptions
    status = absl::InternalError(e.what());
  }
  if (!status.ok()) {
    fprintf(stderr, "ffn_tp_check: rank %d %s: %s\n", info->rank,
            exit_code == tr::kPeerFailureExitCode ? "stopping, another rank failed" : "failed",
            status.ToString().c_str());
    return exit_code;
  }
  return 0;
}
