#include "fsdp/fully_shard/flat_param_math.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tpudist::fsdp {

absl::StatusOr<FlatParamLayout> MakeFlatParamLayout(
    absl::Span<const std::vector<int64_t>> shapes, int64_t world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("flat param layout: world size ", world_size));
  }
  FlatParamLayout layout;
  layout.world_size = world_size;
  int64_t offset = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::vector<int64_t>& shape = shapes[i];
    if (shape.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "flat param layout: parameter ", i, " is 0-dim; Shard(0) needs ndim >= 1"));
    }
    if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; })) {
      return absl::InvalidArgumentError(absl::StrCat("flat param layout: parameter ", i,
                                                     " has shape [", absl::StrJoin(shape, ", "), "]"));
    }
    FlatParamEntry e;
    e.shape = shape;
    for (size_t d = 1; d < shape.size(); ++d) e.row_numel *= shape[d];
    e.padded_rows = PaddedChunkSize(shape[0], world_size);
    e.padded_numel = e.padded_rows * e.row_numel;
    e.offset = offset;
    offset += e.padded_numel;
    layout.entries.push_back(std::move(e));
  }
  layout.shard_numel = offset;
  return layout;
}

ChunkExtent ShardRows(const FlatParamEntry& e, int64_t world_size, int64_t rank) {
  return ChunkOf(e.shape[0], world_size, rank);
}

std::vector<int64_t> ShardShape(const FlatParamEntry& e, int64_t world_size, int64_t rank) {
  std::vector<int64_t> shape = e.shape;
  shape[0] = ShardRows(e, world_size, rank).size;
  return shape;
}

RowRange Intersect(RowRange a, RowRange b) {
  const int64_t begin = std::max(a.begin, b.begin);
  const int64_t end = std::min(a.end, b.end);
  return end > begin ? RowRange{begin, end} : RowRange{begin, begin};
}

}  // namespace tpudist::fsdp
