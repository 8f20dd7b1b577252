// Sharded checkpoints of a FullyShard-ed model: every rank writes its own
// shards, rank 0 writes the metadata, and loading works on any world size
// (reshard on load).
//
// Layout under `dir`:
//   shard-<r>-of-<W>.safetensors  rank r's blocks (FQN keys, master dtype);
//                                 r is the rank's row-major index in the
//                                 mesh, W the mesh size
//   metadata.json                 format 2 (shard_blocks.h): per FQN
//                                 the full shape, dtype and which block of
//                                 it (offsets and sizes per dim) each file
//                                 holds
// The block a rank holds of a FullyShard-ed parameter is its torch.chunk
// rows of the parameter's local tensor, placed in the full tensor by the
// parameter's global layout record (fsdp/global_layout.h, set by tensor
// parallel; none = the local tensor is the full one). A parameter FullyShard
// does not own is its record's block on every rank, or, without a record,
// whole in rank 0's file, as are buffers. Blocks equal to a lower rank's
// (replicas, e.g. TP-Replicate parameters) are written once.
//
// Loading on any layout: each rank computes the block it needs the same way
// and copies, from every saved block, the N-D intersection. Checkpoints of
// format 1 (before blocks: rank r of W held rows torch.chunk(d0, W)[r]) load
// through the same path.
//
// `mesh` spans every rank that holds a piece: for TP x FSDP the 2-D (dp, tp)
// mesh, not its dp slice. Save is collective over it (a gather of the block
// descriptions, a barrier at the end so a load may follow). Load needs no
// communication: each rank reads the files it needs (shared filesystem).
// REQUIRES: parameters sharded (between steps).
#ifndef TPU_DIST_FSDP_FULLY_SHARD_SHARDED_CHECKPOINT_H_
#define TPU_DIST_FSDP_FULLY_SHARD_SHARDED_CHECKPOINT_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fsdp/device_mesh.h"
#include "fsdp/fully_shard/state_dict.h"

namespace tpudist::fsdp {

// `dir` must exist. Frozen parameters are skipped with
// options.ignore_frozen_params (only that flag is read). FailedPrecondition
// when the blocks of all ranks do not tile a tensor (e.g. the dp slice was
// passed for a TP x FSDP model) or a record disagrees with FullyShard.
absl::Status SaveShardedCheckpoint(const std::shared_ptr<torch::nn::Module>& model,
                                   const DeviceMesh& mesh, const std::string& dir,
                                   const StateDictOptions& options = {});

// SaveShardedCheckpoint in two halves, for asynchronous saves: Collect is
// the collective half (gathers the block descriptions; every rank agrees on
// its status) and returns this rank's tensors as views of the live
// parameters plus, on rank 0, metadata.json's text; WriteShardedParts writes
// them with no communication (so from a background thread, once the caller
// has copied the views). Same files as SaveShardedCheckpoint.
struct ShardedCheckpointParts {
  int64_t rank = 0;
  int64_t world_size = 1;
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // FQN -> this rank's block
  std::string metadata_json;                                // rank 0 only, else ""
};
absl::StatusOr<ShardedCheckpointParts> CollectShardedCheckpoint(const std::shared_ptr<torch::nn::Module>& model,
                                                               const DeviceMesh& mesh,
                                                               const StateDictOptions& options = {});
absl::Status WriteShardedParts(const ShardedCheckpointParts& parts, const std::string& dir);

// NotFound / DataLoss name the file (DataLoss also the tensor, for a
// corrupt or inconsistent block description); InvalidArgument names a
// missing key or a full-shape mismatch. Keys skipped on save (frozen) keep their current values.
absl::Status LoadShardedCheckpoint(const std::shared_ptr<torch::nn::Module>& model,
                                   const DeviceMesh& mesh, const std::string& dir);

// Writes the full state dict (rank 0's GetModelStateDict) as one
// safetensors file that Python tools open. Collective.
absl::Status SaveFullSafetensors(const std::shared_ptr<torch::nn::Module>& model,
                                 const DeviceMesh& mesh, const std::string& path,
                                 const StateDictOptions& options = {});

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_FULLY_SHARD_SHARDED_CHECKPOINT_H_
