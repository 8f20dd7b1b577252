// One fine-tune checkpoint: what every rank writes at an epoch end so that
// a restarted job continues exactly, and what rank 0 exports for use.
//
//   <run_dir>/checkpoint_<timestamp>/
//     config.json, model.safetensors,     the full model in HF form (rank 0;
//     tokenizer.json, ...                 a loadable --model-dir, fp32)
//     shards/shard-<r>-of-<W>.safetensors model shards (each rank) +
//     shards/metadata.json                fsdp/fully_shard sharded_checkpoint.h
//     shards/optim-<r>-of-<W>.safetensors AdamW state shards (each rank;
//                                         HSDP (dp_replicate R x dp_shard S):
//                                         optim-<s>-of-<S>, replicate row 0
//                                         only: one copy, like the model's)
//     dcp/shard-<r+1>-model-00001-of-00001.safetensors
//                                         with dcp_export only: weights +
//                                         AdamW state in torch DCP's HF
//                                         layout (fsdp/fully_shard/dcp_checkpoint.h)
//     trainer_state.json                  {"epoch","step","seed","world_size",
//                                          "dataset_size","loss"[,"dp_replicate"]}
//                                         (rank 0)
//     checkpoint.json                     CheckpointManager's marker, last
//
// Protocol (collective over the mesh; `manager` non-null on rank 0 only):
// rank 0 BeginWrite()s the temp dir and publishes its path under a store
// key; all ranks write their shards; the full state dict is gathered to
// rank 0 (cpu offload, frozen PLE skipped and taken from rank 0's own fp32
// copy instead, since it never changes) and exported; barrier; rank 0
// Commit()s (atomic rename + marker with every file's CRC-32 and the job
// fingerprint) and prunes to the best num_to_keep. A rank dying anywhere
// before Commit leaves only a temp dir.
//
// Restore: rank 0 has already chosen a checkpoint that verifies byte for
// byte (resume_plan.h); each rank still checks the CRC-32 of every file it
// reads (trainer_state.json, shards/metadata.json, its own and rank 0's
// model shard, its optimizer shard) against checkpoint.json right before
// loading, so a file damaged in between, or a host that sees other bytes,
// is an error rather than silently wrong weights. checkpoint.json itself is
// checked against its manifest_crc32 on every rank. Reads that fail with an
// I/O error are retried and then reported as one (Unavailable naming the
// file, checkpoint_file_reader.h), never as DataLoss.
#ifndef TPU_DIST_TRAIN_FINETUNE_CHECKPOINT_H_
#define TPU_DIST_TRAIN_FINETUNE_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/optim/adamw.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "train/async_checkpoint_writer.h"
#include "train/checkpoint_manager.h"
#include "fsdp/device_mesh.h"
#include "models/gemma/gemma_model.h"

namespace tpudist::train {

// Where training stands; what trainer_state.json records.
struct TrainerState {
  int64_t epoch = 0;  // 0-based epoch this checkpoint is in
  int64_t step = 0;   // batches of `epoch` already consumed
  uint64_t seed = 0;
  int world_size = 1;
  int64_t dataset_size = 0;
  double loss = 0.0;  // the epoch's all-reduced loss
  // HSDP replicas of the writer's mesh (1: a 1-D or (dp, tp) mesh); recorded
  // in trainer_state.json only when != 1.
  int64_t dp_replicate = 1;
};

// Everything a checkpoint write or restore touches; views, not owned.
struct CheckpointTarget {
  models::gemma::GemmaForCausalLM model{nullptr};  // FullyShard-ed
  const fsdp::DeviceMesh* mesh = nullptr;
  torch::optim::AdamW* optimizer = nullptr;
  c10::intrusive_ptr<c10d::Store> store;  // for sharing the temp path
  at::Tensor ple_fp32;                    // [Vp, L * P] frozen table, rank 0
  std::string model_dir;                  // tokenizer files are copied from it
  bool dcp_export = false;                // also write dcp/ (torch.distributed.checkpoint)
  JobFingerprint job;                     // rank 0: recorded in checkpoint.json
  absl::Duration timeout = absl::Minutes(5);
};

// Writes and commits one checkpoint (protocol above). Returns the committed
// path on rank 0, "" on the others.
absl::StatusOr<std::string> SaveFineTuneCheckpoint(const CheckpointTarget& target,
                                                   CheckpointManager* manager,
                                                   const TrainerState& state, int64_t sequence);

// Asynchronous saves (--async-checkpoint; async_checkpoint_writer.h). Host
// copies of this rank's part, reused from one save to the next (tensors are
// reallocated only when a name, shape or dtype changes).
struct CheckpointStaging {
  std::vector<std::pair<std::string, at::Tensor>> model;  // this rank's model blocks (master dtype)
  std::vector<std::pair<std::string, at::Tensor>> optim;  // AdamW exp_avg/exp_avg_sq/step shards
  std::string shards_metadata;                            // rank 0: shards/metadata.json
};

// The blocking half of an asynchronous save (collective over the mesh, on
// the training thread): rank 0 BeginWrite()s the temp dir and publishes it;
// every rank copies its model and optimizer shards into `staging`; the HF
// export's gather of the full state dict (rank 0 keeps it) and, with
// dcp_export, the dcp/ files are done here too (both are collectives). Then
// `writer` writes the shards (and, on rank 0, the HF export and
// trainer_state.json) in the background and rank 0 commits once every rank's
// part is written; writer->Wait() returns the committed path on rank 0.
// REQUIRES: !writer->in_flight(); `staging` and `manager` outlive the save.
absl::Status StartAsyncFineTuneCheckpoint(const CheckpointTarget& target, CheckpointManager* manager,
                                          const TrainerState& state, int64_t sequence,
                                          CheckpointStaging* staging, AsyncCheckpointWriter* writer);

// Restores model shards and optimizer state from checkpoint `dir` (every
// rank; same world size as the writer) and returns its trainer state. A
// checkpoint of another HSDP replica count (slice count) at the same world
// size reloads too: model shards onto the new layout, the AdamW state from
// its dcp/ copy (FailedPrecondition naming both counts when it has none).
// DataLoss naming the file when one this rank reads fails its CRC-32;
// Unavailable naming the file when it cannot be read after retries;
// FailedPrecondition when the world size differs, or (unless
// allow_mismatch) the dataset size or seed.
absl::StatusOr<TrainerState> RestoreFineTuneCheckpoint(const CheckpointTarget& target,
                                                       const std::string& dir,
                                                       const TrainerState& expect,
                                                       bool allow_mismatch = false);

// trainer_state.json round trip. Pure.
std::string TrainerStateToJson(const TrainerState& s);
absl::StatusOr<TrainerState> TrainerStateFromJson(const std::string& text, const std::string& where);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_FINETUNE_CHECKPOINT_H_
