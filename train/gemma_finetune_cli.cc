#include "train/gemma_finetune_cli.h"

#include <stdio.h>
#include <stdlib.h>

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "train/metrics_log.h"
#include "train/training_flags.h"
#include "tpu_runtime/duration_check.h"
#include "tpu_runtime/slice_env.h"

ABSL_FLAG(std::string, model_dir, TPU_DIST_SOURCE_DIR "/data/tiny_gemma", "HF-format model directory");
ABSL_FLAG(std::string, topology, "", "expected slice topology (e.g. 4x4); empty: as discovered");
ABSL_FLAG(std::string, accelerator_type, "", "expected accelerator type (e.g. TPU-V6E); empty: as discovered");
ABSL_FLAG(int, num_workers, 0, "expected number of ranks; 0: as discovered");
ABSL_FLAG(std::string, dataset, TPU_DIST_SOURCE_DIR "/data/instructions/train.jsonl", "Dolly-format JSONL");
ABSL_FLAG(std::string, dataset_split, "train[:1024]", "HF split syntax, e.g. train[:1024], train[:10%]");
ABSL_FLAG(int64_t, num_epochs, 3, "epochs");
ABSL_FLAG(int64_t, batch_size_per_device, 4, "rows per rank per step");
ABSL_FLAG(int64_t, max_seq_len, 512, "tokens per row (truncation + padding)");
ABSL_FLAG(bool, include_context, false,
          "add a \"Context: ...\" line to the prompt for examples with a context (the seed's prompt has none)");
ABSL_FLAG(double, lr, 2e-5, "AdamW learning rate");
ABSL_FLAG(double, weight_decay, 0.01, "AdamW weight decay");
ABSL_FLAG(int64_t, tp, 1,
          "tensor-parallel ranks per data-parallel replica; must divide the world size (mesh world/tp x tp)");
ABSL_FLAG(bool, hsdp, false,
          "hybrid sharding (HSDP): a (dp_replicate, world/dp_replicate) mesh with dims (\"dp_replicate\", "
          "\"dp_shard\"): shard inside a slice, replicate across slices");
ABSL_FLAG(int64_t, dp_replicate, 0,
          "with --hsdp: replicas (the mesh's first dim); 0: the job's slice count (MEGASCALE_NUM_SLICES, "
          "tpurun --num-slices)");
ABSL_FLAG(std::string, storage_path, "",
          "run storage (required; default $STORAGE_PATH): a directory, file:///dir or s3://bucket[/prefix]");
ABSL_FLAG(std::string, staging_path, "",
          "with a URI --storage-path: local directory checkpoints are committed in before upload "
          "(default /tmp/gemma_finetune_staging)");
ABSL_FLAG(std::string, run_name, "", "run directory name (default gemma_finetune_<job id>)");
ABSL_FLAG(int, num_to_keep, 1, "checkpoints kept (best by loss, plus the latest); <= 0 keeps all");
ABSL_FLAG(int, max_failures, -1, "restarts allowed (-1: $TORCHELASTIC_MAX_RESTARTS, else 0)");
ABSL_FLAG(uint64_t, seed, 0, "sampler shuffle seed");
ABSL_FLAG(bool, bf16, true, "bf16 compute (fp32 master weights and gradient reduction)");
ABSL_FLAG(bool, resume_mismatched, false,
          "resume from the run directory's checkpoint even if another job (other flags, model or data) wrote it");
ABSL_FLAG(bool, dcp_export, false,
          "each checkpoint also gets dcp/: weights + AdamW state that torch's dcp.load reads at any world size");
ABSL_FLAG(std::string, init_from_dcp, "",
          "a fresh run starts from this torch DCP checkpoint (HuggingFaceStorageWriter layout, any world size)");
ABSL_FLAG(absl::Duration, timeout, absl::Minutes(5), "store and collective timeout");
ABSL_FLAG(bool, async_checkpoint, false,
          "epoch-end checkpoints block only for a host copy of the shards; a background thread writes and "
          "commits them (the next save and the end of training wait for it)");
ABSL_FLAG(int, die_rank, -1, "test: this rank raises SIGKILL in attempt 0 ...");
ABSL_FLAG(int, die_slice, -1, "test: every rank of this slice raises SIGKILL in attempt 0 ...");
ABSL_FLAG(int64_t, die_epoch, 0, "test: ... at this 0-based epoch ...");
ABSL_FLAG(int64_t, die_step, 0, "test: ... before this 0-based step");

namespace tpudist::train {
namespace {

namespace tr = ::tpudist::tpu_runtime;

int MaxFailures() {
  int n = absl::GetFlag(FLAGS_max_failures);
  if (n >= 0) return n;
  const char* env = getenv("TORCHELASTIC_MAX_RESTARTS");
  return env != nullptr && absl::SimpleAtoi(env, &n) ? n : 0;
}

}  // namespace

absl::StatusOr<FineTuneConfig> FineTuneConfigFromFlags() {
  if (absl::Status s = ValidateTrainingFlags({absl::GetFlag(FLAGS_num_epochs),
                                                  absl::GetFlag(FLAGS_batch_size_per_device),
                                                  absl::GetFlag(FLAGS_max_seq_len), absl::GetFlag(FLAGS_lr),
                                                  absl::GetFlag(FLAGS_weight_decay), absl::GetFlag(FLAGS_tp)});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = tr::CheckUserDuration("--timeout", absl::GetFlag(FLAGS_timeout), tr::DurationRule::kPositive);
      !s.ok()) {
    return s;
  }
  FineTuneConfig c;
  c.model_dir = absl::GetFlag(FLAGS_model_dir);
  c.dataset = absl::GetFlag(FLAGS_dataset);
  c.dataset_split = absl::GetFlag(FLAGS_dataset_split);
  c.num_epochs = absl::GetFlag(FLAGS_num_epochs);
  c.batch_size_per_device = absl::GetFlag(FLAGS_batch_size_per_device);
  c.max_seq_len = absl::GetFlag(FLAGS_max_seq_len);
  c.include_context = absl::GetFlag(FLAGS_include_context);
  c.lr = absl::GetFlag(FLAGS_lr);
  c.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  c.tp = absl::GetFlag(FLAGS_tp);
  c.hsdp = absl::GetFlag(FLAGS_hsdp);
  c.dp_replicate = absl::GetFlag(FLAGS_dp_replicate);
  if (c.dp_replicate < 0 || (c.dp_replicate > 0 && !c.hsdp)) {
    return absl::InvalidArgumentError(absl::StrCat("--dp-replicate ", c.dp_replicate,
                                                   ": must be >= 1 and comes with --hsdp (0: the slice count)"));
  }
  if (c.hsdp && c.tp != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hsdp with --tp ", c.tp, ": HSDP x tensor parallel (a 3-D mesh) is not supported"));
  }
  c.storage_path = absl::GetFlag(FLAGS_storage_path);
  if (c.storage_path.empty() && getenv("STORAGE_PATH") != nullptr) c.storage_path = getenv("STORAGE_PATH");
  c.staging_path = absl::GetFlag(FLAGS_staging_path);
  c.run_name = absl::GetFlag(FLAGS_run_name);
  c.num_to_keep = absl::GetFlag(FLAGS_num_to_keep);
  c.max_failures = MaxFailures();
  c.seed = absl::GetFlag(FLAGS_seed);
  c.bf16 = absl::GetFlag(FLAGS_bf16);
  c.resume_mismatched = absl::GetFlag(FLAGS_resume_mismatched);
  c.dcp_export = absl::GetFlag(FLAGS_dcp_export);
  c.init_from_dcp = absl::GetFlag(FLAGS_init_from_dcp);
  c.timeout = absl::GetFlag(FLAGS_timeout);
  c.async_checkpoint = absl::GetFlag(FLAGS_async_checkpoint);
  c.die_rank = absl::GetFlag(FLAGS_die_rank);
  c.die_slice = absl::GetFlag(FLAGS_die_slice);
  c.die_epoch = absl::GetFlag(FLAGS_die_epoch);
  c.die_step = absl::GetFlag(FLAGS_die_step);
  return c;
}

absl::Status CheckJobShape(const tr::RankInfo& info) {
  const std::string topo = absl::GetFlag(FLAGS_topology), acc = absl::GetFlag(FLAGS_accelerator_type);
  if (!topo.empty() || !acc.empty()) {
    absl::StatusOr<tr::SliceSpec> want =
        tr::SliceSpecFromFlags(acc.empty() ? info.slice.accelerator_type : acc, topo);
    if (!want.ok()) return want.status();
    // The topology is one slice's; a multi-slice job has num_slices of them.
    if (want->num_devices() * info.num_slices != info.world_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--topology/--accelerator-type give ", want->num_devices(), " devices",
          info.num_slices > 1 ? absl::StrCat(" per slice x ", info.num_slices, " slices") : "",
          " but the job has ", info.world_size, " ranks"));
    }
  }
  const int n = absl::GetFlag(FLAGS_num_workers);
  if (n > 0 && n != info.world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("--num-workers ", n, " but the job has ", info.world_size, " ranks"));
  }
  return absl::OkStatus();
}

void PrintFineTuneResult(const FineTuneResult& result) {
  std::string line = EpochMetricsToJsonLine(result.final_metrics);
  if (!line.empty() && line.back() == '\n') line.pop_back();
  if (result.already_finished) {
    printf("Training already completed: all %lld epochs are in the run directory, nothing to train "
           "(use a new --run-name to train again).\n",
           static_cast<long long>(result.final_metrics.epoch));
    if (result.final_metrics_logged) {
      printf("Final metrics (logged): %s\n", line.c_str());
    } else {
      printf("Final loss: %.4f (epoch %lld; its metrics.jsonl line is missing)\n", result.final_metrics.loss,
             static_cast<long long>(result.final_metrics.epoch));
    }
    printf("Checkpoint: %s\n", result.latest_checkpoint.c_str());
  } else {
    printf("Training completed! Final metrics: %s\n", line.c_str());
    printf("Saved checkpoint: %s\n", result.latest_checkpoint.c_str());
  }
  fflush(stdout);
}

}  // namespace tpudist::train
