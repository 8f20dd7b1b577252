// ffn_tp_check: DTensor tensor-parallel parity of a feed-forward block on
// every rank of a (possibly emulated) slice, then an all_reduce check.
//
//   tpurun --accelerator-type TPU-V6E --topology 4x4 --hosts-emulated --
//       build/examples/ffn_tp_check [--backend gloo]
//
// Each rank joins the job (distributed/job.h), builds a 1-D DeviceMesh "tp"
// of all ranks on its groups (tpu_dist by default: shm inside an emulated
// host, TCP between; --backend gloo for a comparison point) and runs
// CheckFfnTpParity (fsdp/ffn_tp_parity.h): rank 0 prints one line per
// rank and a summary; exit status 1 on any mismatch. --wrong-style (the
// negative test) leaves w2's output Partial: parity must then fail.
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "distributed/job.h"
#include "distributed/rank_main.h"
#include "fsdp/ffn_tp_parity.h"
#include "fsdp/job_mesh.h"
#include "tpu_runtime/duration_check.h"
#include "tpu_runtime/launcher/flag_names.h"
#include "tpu_runtime/slice_env.h"

ABSL_FLAG(std::string, topology, "", "expected slice topology (e.g. 4x4); empty: as discovered");
ABSL_FLAG(std::string, accelerator_type, "", "expected accelerator type (e.g. TPU-V6E); empty: as discovered");
ABSL_FLAG(int64_t, batch_size, 4, "rows of the input");
ABSL_FLAG(int64_t, hidden_dim, 64, "FeedForward hidden size (w1: hidden -> 4*hidden)");
ABSL_FLAG(bool, wrong_style, false, "negative test: leave w2's output Partial (must fail)");
ABSL_FLAG(std::string, backend, "tpu_dist", "process-group backend: tpu_dist (default) or gloo");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(120), "store and collective timeout");

namespace tr = ::tpudist::tpu_runtime;
namespace dist = ::tpudist::distributed;

// The job has as many ranks as --topology / --accelerator-type say.
static absl::Status CheckShape(const tr::RankInfo& info) {
  const std::string topo = absl::GetFlag(FLAGS_topology), acc = absl::GetFlag(FLAGS_accelerator_type);
  if (topo.empty() && acc.empty()) return absl::OkStatus();
  absl::StatusOr<tr::SliceSpec> want = tr::SliceSpecFromFlags(acc.empty() ? info.slice.accelerator_type : acc, topo);
  if (!want.ok()) return want.status();
  if (want->num_devices() == info.world_size) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("--topology gives ", want->num_devices(),
                                                    " devices but the job has ", info.world_size, " ranks"));
}

int main(int argc, char** argv) {
  tr::launcher::NormalizedArgv args(argc, argv);  // --hidden-dim etc.
  absl::ParseCommandLine(args.argc(), args.argv());
  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
  if (int code = dist::UsageExitCode(
          "ffn_tp_check", {tr::CheckUserDuration("--timeout", timeout, tr::DurationRule::kPositive)})) {
    return code;
  }
  const tpudist::fsdp::FfnTpParityOptions check{absl::GetFlag(FLAGS_batch_size), absl::GetFlag(FLAGS_hidden_dim),
                                                    absl::GetFlag(FLAGS_wrong_style), absl::GetFlag(FLAGS_backend),
                                                    timeout};
  return dist::RunRankMain("ffn_tp_check", [&](const tr::RankInfo& info) {
    if (absl::Status s = CheckShape(info); !s.ok()) return s;
    dist::JobOptions o;  // store and group options by distributed/group_config.h's one rule
    o.name = "ffn_tp_check";
    o.group.group_name = "ffn_tp";
    o.group.backend = check.backend;
    o.group.timeout = timeout;
    return dist::RunJob(info, o, [&](dist::Job& job) {
      absl::StatusOr<tpudist::fsdp::DeviceMesh> mesh =
          tpudist::fsdp::InitJobDeviceMesh(job, {"tpu", {info.world_size}, {"tp"}, "tp_mesh"});
      if (!mesh.ok()) return mesh.status();
      return tpudist::fsdp::CheckFfnTpParity(info, *mesh, *job.store(), check);
    });
  });
}
