// Which block of each full tensor this rank holds under FullyShard (and a
// tensor-parallel global layout record), shared by the two sharded
// checkpoint writers/readers: our own format (sharded_checkpoint.h) and
// torch DCP's (dcp_checkpoint.h). Internal to fsdp/fully_shard.
//
// REQUIRES: parameters sharded (between steps). Thread-compatible.
#ifndef TPU_DIST_FSDP_FULLY_SHARD_INTERNAL_LOCAL_BLOCKS_H_
#define TPU_DIST_FSDP_FULLY_SHARD_INTERNAL_LOCAL_BLOCKS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fsdp/fully_shard/fsdp_param_group.h"
#include "fsdp/fully_shard/shard_blocks.h"
#include "fsdp/fully_shard/state_dict.h"

namespace tpudist::fsdp::internal {

// One tensor this rank knows: its full shape and, when this rank's file
// should hold a piece, that piece and the block it is.
struct LocalTensor {
  std::string name;
  std::vector<int64_t> shape;  // full
  at::ScalarType dtype = at::kFloat;
  at::Tensor data;             // [block.sizes]; undefined: this rank writes nothing of it
  Block block;
  at::Tensor param;            // the parameter (undefined for buffers): optimizer state key
};

// The block of the full tensor that `p` (parameter i of `g`) holds on this
// rank: the global-layout record's block of the local tensor (fsdp/
// global_layout.h; whole when none), narrowed to this rank's torch.chunk
// rows of the local dim 0. FailedPrecondition when the record disagrees
// with FullyShard's shape.
absl::StatusOr<Block> FsdpShardBlock(const FsdpParamGroup& g, size_t i, const at::Tensor& p,
                                     const std::string& name, std::vector<int64_t>* full_shape);

// A parameter FullyShard does not own: its record's block, or whole.
Block UnshardedBlock(const at::Tensor& p, std::vector<int64_t>* full_shape);

// Every parameter (frozen ones skipped with options.ignore_frozen_params)
// and buffer of `model`, with this rank's block. Data is set for FullyShard
// shards, recorded (TP) pieces, and, on rank 0 only, unrecorded unsharded
// parameters and buffers. `what` prefixes errors.
absl::StatusOr<std::vector<LocalTensor>> CollectLocalTensors(const std::shared_ptr<torch::nn::Module>& model,
                                                             int64_t rank, const StateDictOptions& options,
                                                             absl::string_view what);

// This rank's description of `local` for AllGatherJson: name, shape, dtype
// and, where it holds data, offsets and sizes.
nlohmann::json DescribeLocalTensors(const std::vector<LocalTensor>& local);

// Merges every rank's description (in rank order) into tiles of each
// tensor; a block identical to an earlier rank's is kept once (TP
// replicas), and `local` entries of this rank that lost that way (or are
// empty) get their data dropped. FailedPrecondition (prefixed by `what`)
// when the blocks do not tile a tensor.
absl::StatusOr<ShardedCheckpointMetadata> MergeBlocks(const std::vector<nlohmann::json>& all, int64_t rank,
                                                      std::vector<LocalTensor>& local, absl::string_view what);

// The block this rank's copy of `t` (a parameter or buffer of a FullyShard-ed
// model) covers, and the tensor to copy loaded values into: the flat-shard
// view for FullyShard parameters, else `t`. dst: [mine.sizes].
struct LoadTarget {
  Block mine;
  std::vector<int64_t> full_shape;
  at::Tensor dst;
};
absl::StatusOr<LoadTarget> TargetOf(const FsdpGroupIndex& index, const at::Tensor& t, const std::string& name);

// `t` narrowed to `b` (offsets relative to t's origin). t: [any], same ndim as b.
at::Tensor NarrowToBlock(at::Tensor t, const Block& b);

// `b` moved so that `origin` is at zero.
Block RelativeBlock(Block b, const std::vector<int64_t>& origin);

}  // namespace tpudist::fsdp::internal

#endif  // TPU_DIST_FSDP_FULLY_SHARD_INTERNAL_LOCAL_BLOCKS_H_
