// Global layout records: where a parameter's local tensor sits inside the
// full (global) tensor, so code that knows nothing about the layer that
// sharded it (sharded checkpoints) can place its data.
//
// The contract between a sharding layer (tensor parallel) and readers
// (fsdp/fully_shard/sharded_checkpoint):
//
//   * A layer that replaces a parameter's data with a piece of a larger
//     tensor (param.set_data(local), TensorImpl kept) records, right after,
//       SetGlobalLayout(param, {full_shape, offsets});
//     meaning: the parameter's current tensor, of shape `local_shape`, is the
//     dense block full[offsets[0] : offsets[0] + local_shape[0], ...] of a
//     full tensor of shape `full_shape` (one offset per dim). Placements on a
//     1-D mesh all fit: Shard(d) of torch.chunk -> offsets[d] = ChunkOf(
//     full_shape[d], tp, tp_rank).offset, others 0; Replicate -> all 0,
//     local_shape == full_shape (every replica records the same block, the
//     checkpoint writes it once). `local_shape` is taken from the parameter
//     at Set time.
//   * A parameter without a record is its own full tensor (offsets 0).
//   * FullyShard (applied later, over "dp") shards the *local* tensor's dim 0
//     and composes: rank r's block is offsets + (ChunkOf(local_shape[0], dp,
//     r).offset along dim 0), sizes local_shape with dim 0 = that chunk.
//     FullyShard does not read or change the record; it stays valid while
//     the parameter is sharded/unsharded by FullyShard (same TensorImpl).
//   * Records are keyed by the parameter's TensorImpl and hold it weakly: a
//     record dies with its parameter (no dangling keys, no address reuse).
//
// Thread-safety: all functions are safe to call concurrently (one mutex), so
// ranks run as threads in one process (tests) may each set their own
// parameters' records.
#ifndef TPU_DIST_FSDP_GLOBAL_LAYOUT_H_
#define TPU_DIST_FSDP_GLOBAL_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"

namespace tpudist::fsdp {

struct GlobalLayout {
  std::vector<int64_t> full_shape;   // global shape, ndim == param.dim()
  std::vector<int64_t> offsets;      // of local element [0, ..., 0], one per dim
  std::vector<int64_t> local_shape;  // the parameter's shape when recorded
  bool operator==(const GlobalLayout& o) const {
    return full_shape == o.full_shape && offsets == o.offsets && local_shape == o.local_shape;
  }
  // "full [8, 6] offsets [4, 0] local [4, 6]".
  std::string ToString() const;
};

// Records that `param` (its current shape is the local shape) is the block at
// `offsets` of a tensor of `full_shape`; replaces an earlier record.
// InvalidArgument (nothing recorded) when `param` is undefined, the ranks
// differ, or the block does not fit: offsets[d] < 0 or offsets[d] +
// param.size(d) > full_shape[d].
absl::Status SetGlobalLayout(const at::Tensor& param, std::vector<int64_t> full_shape,
                             std::vector<int64_t> offsets);

// The record of `param`, or nullopt when none (the parameter is whole).
std::optional<GlobalLayout> GetGlobalLayout(const at::Tensor& param);

// Drops the record of `param` (no-op when none), e.g. when a layer gathers a
// parameter back to full.
void ClearGlobalLayout(const at::Tensor& param);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_GLOBAL_LAYOUT_H_
