#include "fsdp/shard_math.h"

#include <algorithm>

namespace tpudist::fsdp {

int64_t PaddedChunkSize(int64_t size, int64_t num_chunks) {
  return (size + num_chunks - 1) / num_chunks;
}

ChunkExtent ChunkOf(int64_t size, int64_t num_chunks, int64_t index) {
  const int64_t full = PaddedChunkSize(size, num_chunks);
  const int64_t start = full * index;
  if (start >= size) return ChunkExtent{0, size};
  return ChunkExtent{std::min(size, start + full) - start, start};
}

std::vector<ChunkExtent> LocalExtents(absl::Span<const int64_t> global_shape,
                                      absl::Span<const int64_t> mesh_shape,
                                      absl::Span<const int64_t> coordinate,
                                      absl::Span<const Placement> placements,
                                      int64_t up_to_mesh_dim) {
  std::vector<ChunkExtent> ext;
  for (int64_t s : global_shape) ext.push_back(ChunkExtent{s, 0});
  for (int64_t m = 0; m < up_to_mesh_dim; ++m) {
    const Placement& p = placements[m];
    if (!p.is_shard()) continue;
    ChunkExtent& e = ext[p.dim()];
    const ChunkExtent piece = ChunkOf(e.size, mesh_shape[m], coordinate[m]);
    e = ChunkExtent{piece.size, e.offset + piece.offset};
  }
  return ext;
}

std::vector<int64_t> LocalShape(absl::Span<const int64_t> global_shape,
                                absl::Span<const int64_t> mesh_shape,
                                absl::Span<const int64_t> coordinate,
                                absl::Span<const Placement> placements) {
  std::vector<int64_t> shape;
  for (const ChunkExtent& e : LocalExtents(global_shape, mesh_shape, coordinate, placements,
                                           static_cast<int64_t>(placements.size()))) {
    shape.push_back(e.size);
  }
  return shape;
}

}  // namespace tpudist::fsdp
