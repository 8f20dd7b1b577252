// The block description of a sharded checkpoint (metadata.json): which
// block of every full tensor each saving rank's file holds. Pure functions,
// thread-safe.
//
// Format 2 (written since #15 item 3):
//   {"format": 2, "world_size": W,
//    "tensors": {FQN: {"shape": [d0, d1, ...], "dtype": "Float",
//                      "blocks": [{"rank": r, "offsets": [...], "sizes": [...]}, ...]}}}
//   Block b of FQN is full[offsets[0] : offsets[0] + sizes[0], ...], stored
//   under key FQN in shard-<b.rank>-of-<W>.safetensors with shape `sizes`.
//   The blocks of a tensor tile it exactly (pairwise disjoint, union = all);
//   a tensor kept whole (buffers, unsharded parameters) is one block of rank
//   0 at offsets 0.
// Format 1 (no "format" key; written before): {"world_size": W, "tensors":
//   {FQN: {"shape", "dtype", "sharded": bool}}}. A sharded tensor's rank r
//   holds rows torch.chunk(d0, W)[r] (all other dims whole); an unsharded
//   one is whole in rank 0's file. Parsed into the same blocks, so loaders
//   see one model.
#ifndef TPU_DIST_FSDP_FULLY_SHARD_SHARD_BLOCKS_H_
#define TPU_DIST_FSDP_FULLY_SHARD_SHARD_BLOCKS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tpudist::fsdp {

// A dense box of a tensor: one offset and size per dim.
struct Block {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  int64_t numel() const;
  bool operator==(const Block& o) const { return offsets == o.offsets && sizes == o.sizes; }
  // "offsets [4, 0] sizes [2, 6]".
  std::string ToString() const;
};

// The whole of a tensor of `shape`.
Block WholeBlock(const std::vector<int64_t>& shape);

// N-D overlap of `a` and `b` (the generalisation of flat_param_math.h
// Intersect): per dim [max(begin), min(end)); numel() == 0 when disjoint.
// REQUIRES: a and b have the same number of dims.
Block IntersectBlocks(const Block& a, const Block& b);

struct SavedBlock {
  int64_t rank = 0;  // whose file holds it
  Block block;
};

struct TensorBlocks {
  std::vector<int64_t> shape;  // full shape
  std::string dtype;           // c10::toString of the saved dtype
  std::vector<SavedBlock> blocks;
};

struct ShardedCheckpointMetadata {
  int64_t world_size = 1;
  std::map<std::string, TensorBlocks> tensors;  // by FQN
};

inline constexpr int kShardedCheckpointFormat = 2;

// Format 2 JSON of `meta`.
nlohmann::json ShardedCheckpointMetadataToJson(const ShardedCheckpointMetadata& meta);

// Parses format 1 or 2 and validates every tensor (ValidateTensorBlocks).
// DataLoss names `path` and, for a bad tensor, the tensor and what is wrong;
// Unimplemented for a format newer than this code.
absl::StatusOr<ShardedCheckpointMetadata> ParseShardedCheckpointMetadata(const nlohmann::json& json,
                                                           const std::string& path);

// OK when `t`'s blocks have its rank, lie inside its shape, come from ranks
// in [0, world_size), and tile it exactly. Otherwise InvalidArgument naming
// `name` and the offending block(s).
absl::Status ValidateTensorBlocks(const std::string& name, const TensorBlocks& t, int64_t world_size);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_FULLY_SHARD_SHARD_BLOCKS_H_
