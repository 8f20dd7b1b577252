// Layout of one FullyShard group's parameters in the flat buffers its
// collectives use. Pure functions, thread-safe.
//
// Each parameter of global shape [d0, d1, ...] is sharded along dim 0 with
// torch.chunk semantics over W ranks (fsdp/shard_math.h): rank r owns rows
// ChunkOf(d0, W, r). Every rank's piece is padded to PaddedChunkSize(d0, W)
// rows, so all ranks hold the same number of elements per parameter and one
// flat buffer per rank can hold the whole group:
//
//   per-rank flat shard  [ p0 rows (padded) | p1 rows (padded) | ... ]
//                          ^offset 0          ^offset = padded_numel(p0)
//   all-gather output    [ rank 0 flat | rank 1 flat | ... ]  = [W, shard_numel]
//
// so parameter i of rank r sits at r * shard_numel + entry.offset, and the
// reduce-scatter input is packed the same way (rank r's region holds the
// rows of every gradient that rank r owns, zero padded).
#ifndef TPU_DIST_FSDP_FULLY_SHARD_FLAT_PARAM_MATH_H_
#define TPU_DIST_FSDP_FULLY_SHARD_FLAT_PARAM_MATH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "fsdp/shard_math.h"

namespace tpudist::fsdp {

struct FlatParamEntry {
  std::vector<int64_t> shape;  // global shape, ndim >= 1
  int64_t row_numel = 1;       // product of shape[1:]
  int64_t padded_rows = 0;     // PaddedChunkSize(shape[0], W)
  int64_t padded_numel = 0;    // padded_rows * row_numel
  int64_t offset = 0;          // first element inside a rank's flat shard
};

struct FlatParamLayout {
  int64_t world_size = 1;
  std::vector<FlatParamEntry> entries;
  int64_t shard_numel = 0;  // elements in one rank's flat shard (padded)
};

// Lays out parameters of `shapes` in order. InvalidArgument when W < 1 or a
// shape is 0-dim or has a negative size.
absl::StatusOr<FlatParamLayout> MakeFlatParamLayout(
    absl::Span<const std::vector<int64_t>> shapes, int64_t world_size);

// Rows of entry `e` that `rank` owns (torch.chunk piece along dim 0).
// REQUIRES: 0 <= rank < layout.world_size.
ChunkExtent ShardRows(const FlatParamEntry& e, int64_t world_size, int64_t rank);

// Shape of rank's (unpadded) shard of `e`: [rows, shape[1:]...].
std::vector<int64_t> ShardShape(const FlatParamEntry& e, int64_t world_size, int64_t rank);

// Overlap of [a_begin, a_end) and [b_begin, b_end) as [begin, end); empty
// (begin == end) when disjoint. Used to reshard on load.
struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
RowRange Intersect(RowRange a, RowRange b);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_FULLY_SHARD_FLAT_PARAM_MATH_H_
