// Sharded checkpoints of a FullyShard-ed model: every rank writes its own
// shards, rank 0 writes the metadata, and loading works on any world size
// (reshard on load).
//
// Layout under `dir`:
//   shard-<r>-of-<W>.safetensors  rank r's local shard of every sharded
//                                 parameter (FQN keys, master dtype); rank
//                                 0's file also holds the unsharded
//                                 parameters and buffers, whole
//   metadata.json                 {"world_size": W, "tensors": {FQN:
//                                 {"shape": [...], "dtype": "F32",
//                                  "sharded": true}}}
// Rank r of W owns rows torch.chunk(d0, W)[r] of a sharded tensor, so the
// loader of rank r' of W' reads, from each old file, the rows its new chunk
// overlaps (flat_param_math.h Intersect) and copies them into its shard.
//
// Save is collective (ends with a barrier so a load may follow). Load needs
// no communication: each rank reads the files it needs (shared filesystem).
// REQUIRES: parameters sharded (between steps).
#ifndef TPU_DIST_FSDP_FULLY_SHARD_SHARDED_CHECKPOINT_H_
#define TPU_DIST_FSDP_FULLY_SHARD_SHARDED_CHECKPOINT_H_

#include <memory>
#include <string>

#include <torch/nn/module.h>

#include "absl/status/status.h"
#include "fsdp/device_mesh.h"
#include "fsdp/fully_shard/state_dict.h"

namespace tpudist::fsdp {

// `dir` must exist. Frozen parameters are skipped with
// options.ignore_frozen_params (only that flag is read).
absl::Status SaveShardedCheckpoint(const std::shared_ptr<torch::nn::Module>& model,
                                   const DeviceMesh& mesh, const std::string& dir,
                                   const StateDictOptions& options = {});

// NotFound / DataLoss name the file; InvalidArgument names a missing key or a
// shape mismatch. Keys skipped on save (frozen) keep their current values.
absl::Status LoadShardedCheckpoint(const std::shared_ptr<torch::nn::Module>& model,
                                   const DeviceMesh& mesh, const std::string& dir);

// Writes the full state dict (rank 0's GetModelStateDict) as one
// safetensors file that Python tools open. Collective.
absl::Status SaveFullSafetensors(const std::shared_ptr<torch::nn::Module>& model,
                                 const DeviceMesh& mesh, const std::string& path,
                                 const StateDictOptions& options = {});

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_FULLY_SHARD_SHARDED_CHECKPOINT_H_
