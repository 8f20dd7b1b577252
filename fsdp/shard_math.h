// Shard sizes and offsets with torch.chunk semantics, and the local shape a
// DTensor has on one mesh coordinate. Pure functions, thread-safe.
//
// torch.chunk(size, n): every piece has ceil(size / n) elements except the
// tail; there may be fewer than n non-empty pieces, the rest are empty.
//   size 10, n 4 -> 3, 3, 3, 1        size 5, n 4 -> 2, 2, 1, 0
//   size 2,  n 4 -> 1, 1, 0, 0        size 0, n 3 -> 0, 0, 0
// Collectives pad every piece to ceil(size / n) and cut the padding after.
//
// Several mesh dims may shard one tensor dim; they apply in mesh-dim order
// (mesh dim 0 chunks first, the next one chunks that chunk), as in PyTorch.
#ifndef TPU_DIST_FSDP_SHARD_MATH_H_
#define TPU_DIST_FSDP_SHARD_MATH_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "fsdp/placement.h"

namespace tpudist::fsdp {

struct ChunkExtent {
  int64_t size = 0;    // elements in this piece (0 for an empty tail piece)
  int64_t offset = 0;  // first element inside the chunked dim; `size` when empty
  bool operator==(const ChunkExtent& o) const { return size == o.size && offset == o.offset; }
};

// ceil(size / num_chunks): the padded size of every piece.
// REQUIRES: size >= 0, num_chunks >= 1.
int64_t PaddedChunkSize(int64_t size, int64_t num_chunks);

// Piece `index` of torch.chunk over `size` elements in `num_chunks` pieces.
// REQUIRES: 0 <= index < num_chunks.
ChunkExtent ChunkOf(int64_t size, int64_t num_chunks, int64_t index);

// Local extent along each tensor dim of the DTensor held at `coordinate`,
// applying the Shard placements of mesh dims [0, up_to_mesh_dim) in order.
// Pass up_to_mesh_dim = placements.size() for the full local shape.
// REQUIRES: placements normalized, one per mesh dim.
std::vector<ChunkExtent> LocalExtents(absl::Span<const int64_t> global_shape,
                                      absl::Span<const int64_t> mesh_shape,
                                      absl::Span<const int64_t> coordinate,
                                      absl::Span<const Placement> placements,
                                      int64_t up_to_mesh_dim);

// Sizes of LocalExtents(..., placements.size()).
std::vector<int64_t> LocalShape(absl::Span<const int64_t> global_shape,
                                absl::Span<const int64_t> mesh_shape,
                                absl::Span<const int64_t> coordinate,
                                absl::Span<const Placement> placements);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_SHARD_MATH_H_
