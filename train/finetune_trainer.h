// RunFineTune: one rank of the Gemma fine-tune (gemma_finetune, the C++
// rebuild of the seed's ray_train_llm_finetune.py). Every process of the job
// calls it with the same config and its own RankInfo.
//
//   data     LoadDollySplit -> TokenizedDataset (the seed's "Instruction: ..
//            \nResponse: .." -- a Context: line only with include_context --
//            tokenized, truncated and padded to max_seq_len as HF's tokenizer
//            call for model_dir (hf_tokenizer_call.h: left padding, no BOS/EOS
//            for the bundled Gemma), labels -100 at pad ids as HF's
//            DataCollatorForLanguageModeling) -> DistributedSampler (shuffle,
//            SetEpoch, drop_last)
//   model    LoadGemmaFromHf (fp32 master) -> ParallelizeGemma (PLE frozen and
//            ignored, FullyShard per layer MLP then root, bf16 compute, fp32
//            reduce) -> AdamW(lr, weight_decay) over the trainable shards
//   epoch    steps; loss = all_reduce AVG of the ranks' epoch-mean losses;
//            rank 0 prints FormatEpochLine, a progress bar on a TTY
//   numerics each step, before the optimizer step, every rank learns every
//            rank's loss and gradient norm (one all-reduce,
//            nonfinite_check.h); a non-finite one stops every rank with a
//            FailedPrecondition naming epoch, step, rank and quantity (the
//            rank it names is the job error's root cause). Before each
//            checkpoint the saved tensors (weights, PLE, AdamW moments) are
//            checked the same way: no checkpoint holds a NaN or inf
//   ckpt     each epoch end (finetune_checkpoint.h): sharded model +
//            optimizer + trainer state, and the full model in HF form, into
//            one atomic checkpoint; keep-best(num_to_keep, loss, min); then
//            rank 0 appends metrics.jsonl
//   start    rank 0 locks the run directory (run_dir_lock.h; a second job
//            on it fails at once naming the holder) and plans the start
//            (run_start.h, resume_plan.h), the same way for a fresh start
//            and a restart:
//            from the newest checkpoint that verifies byte for byte and was
//            written by the same job (fingerprint: model and data files,
//            split, hyper-parameters, world size); a different job is an
//            error unless resume_mismatched; a finished one returns
//            already_finished without training; no checkpoint: fresh.
//            metrics.jsonl is trimmed to the resumed epoch (no duplicates).
//   resume   the run continues exactly where the uninterrupted run would be
//            (model shards, AdamW state, sampler epoch/step; the step uses
//            no RNG)
//
// The run directory is <storage_path>/<run_name> and holds one job; every
// attempt of a job must use the same run_name (default: derived from the
// job id).
// Blocking waits (store, collectives) have config.timeout as deadline.
// Thread-safety: call once per process, from one thread.
#ifndef TPU_DIST_TRAIN_FINETUNE_TRAINER_H_
#define TPU_DIST_TRAIN_FINETUNE_TRAINER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "train/metrics_log.h"
#include "tpu_runtime/rank_info.h"

namespace tpudist::train {

inline constexpr char kDefaultStagingPath[] = "/tmp/gemma_finetune_staging";

struct FineTuneConfig {
  std::string model_dir;      // HF-format directory (config.json, model.safetensors, tokenizer)
  std::string dataset;        // Dolly-format JSONL
  std::string dataset_split = "train[:1024]";
  int64_t num_epochs = 3;
  int64_t batch_size_per_device = 4;
  int64_t max_seq_len = 512;
  bool include_context = false;  // add "Context: ..." lines (the seed has none)
  double lr = 2e-5;
  double weight_decay = 0.01;
  // Tensor-parallel ranks per data-parallel replica: the mesh is (world/tp,
  // tp) with dims ("dp", "tp"); the sampler splits the data over dp only.
  int64_t tp = 1;
  // HSDP (hybrid sharding, torch FSDP2's 2-D mesh): the mesh is
  // (dp_replicate, world / dp_replicate) with dims ("dp_replicate",
  // "dp_shard"): parameters, gradients and AdamW state are sharded over
  // dp_shard (the ranks of one slice) and replicated over dp_replicate
  // (across slices); every rank is a data-parallel rank (the sampler splits
  // over the whole world, as the 1-D mesh does). dp_replicate 0: the job's
  // slice count (RankInfo::num_slices, MEGASCALE_NUM_SLICES / tpurun
  // --num-slices). Requires tp == 1.
  bool hsdp = false;
  int64_t dp_replicate = 0;
  std::string storage_path;   // required: a directory, or a URI (file://, s3://: checkpoint_storage.h)
  // With a URI storage_path, the local directory checkpoints are committed
  // in and then uploaded from ("" -> kDefaultStagingPath).
  std::string staging_path;
  std::string run_name;       // "" -> "gemma_finetune_<job id>"
  int num_to_keep = 1;
  int max_failures = 0;       // restarts allowed (the launcher's --max-restarts)
  uint64_t seed = 0;          // sampler shuffle seed
  bool bf16 = true;           // bf16 compute (fp32 master and reduce)
  // Resume from the run directory's checkpoint even though it was written by
  // a job with another fingerprint (e.g. more epochs, another lr). The world
  // size must still match (optimizer state is not resharded).
  bool resume_mismatched = false;
  // Each checkpoint also gets dcp/: weights + AdamW state that torch's
  // dcp.load reads into FSDP2 at any world size (fsdp/fully_shard/dcp_checkpoint.h).
  bool dcp_export = false;
  // A fresh run (no checkpoint of this job) starts from this torch DCP
  // checkpoint (HuggingFaceStorageWriter layout, any world size): trainable
  // weights, and the AdamW state when it holds one. "" = from model_dir.
  std::string init_from_dcp;
  absl::Duration timeout = absl::Minutes(5);
  // Asynchronous checkpoints (async_checkpoint_writer.h): the epoch end
  // blocks only to stage this rank's shards into host buffers (plus the HF
  // export's gather and --dcp-export's files); a background thread writes
  // and rank 0 commits once every rank's part is written. At most one save
  // in flight: the next epoch end, and the end of training, wait for it.
  bool async_checkpoint = false;
  // Test-only failure injection: rank die_rank SIGKILLs itself before step
  // die_step (0-based) of epoch die_epoch (0-based), in attempt 0 only.
  // die_slice >= 0: every rank of that slice (MEGASCALE_SLICE_ID) does so.
  int die_rank = -1;
  int die_slice = -1;
  int64_t die_epoch = 0;
  int64_t die_step = 0;
};

struct FineTuneResult {
  std::vector<EpochMetrics> epochs;  // the epochs this attempt ran
  EpochMetrics final_metrics;        // the last epoch's (also after resume)
  // All epochs were already done (rank 0: final_metrics is the logged line
  // of the last epoch when final_metrics_logged, else only epoch and loss).
  bool already_finished = false;
  bool final_metrics_logged = true;
  std::string latest_checkpoint;     // path of the newest complete checkpoint
  int64_t resumed_from_epoch = -1;   // 0-based epoch it restarted at; -1 fresh
};

// The run name used when config.run_name is empty. Pure.
std::string DefaultRunName(const std::string& job_id);

// Runs (or resumes) the whole fine-tune on this rank, inside a
// distributed::Job (coordination, store, groups). Errors name the rank and
// the stage; data errors (bad JSONL, missing field, empty split) come back as
// InvalidArgument/NotFound from the loaders, before any rendezvous. An error
// after the rendezvous is reported to the whole job; every error carries its
// exit code (distributed::ExitCodeOf): 1 for this rank's own failure,
// kPeerFailureExitCode (75) when another rank failed first.
absl::StatusOr<FineTuneResult> RunFineTune(const tpu_runtime::RankInfo& info,
                                           const FineTuneConfig& config);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_FINETUNE_TRAINER_H_
