#include "collectives/core/chunking.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tpudist::collectives {

int64_t NumChunks(int64_t total, int64_t chunk) {
  return total <= 0 ? 0 : (total + chunk - 1) / chunk;
}

Range ChunkRange(int64_t total, int64_t chunk, int64_t index) {
  const int64_t begin = index * chunk;
  return Range{begin, std::min(chunk, total - begin)};
}

Range EvenSlice(int64_t total, int64_t parts, int64_t index) {
  const int64_t base = total / parts;
  const int64_t extra = total % parts;
  const int64_t begin = index * base + std::min(index, extra);
  return Range{begin, base + (index < extra ? 1 : 0)};
}

PipelinedLayout PipelinedAllReduceLayout(int64_t slot_bytes, int64_t elem_size, int world) {
  auto offset = [](int64_t elems, int64_t es) { return (elems * es + 63) & ~int64_t{63}; };
  auto fits = [&](int64_t c) {
    return offset(c, elem_size) + (c + world - 1) / world * elem_size <= slot_bytes;
  };
  // Start from the estimate C * (1 + 1/W) = slot and step down past the
  // alignment padding and rounding (at most 64 / elem_size + 1 steps).
  int64_t c = slot_bytes / elem_size * world / (world + 1);
  while (c > 1 && !fits(c)) --c;
  c = std::max<int64_t>(c, 1);
  return PipelinedLayout{c, offset(c, elem_size)};
}

int64_t AllReducePhaseBytes(int64_t slot_bytes, int /*world*/) {
  return std::min(slot_bytes, kAllReducePhaseMaxBytes);
}

std::vector<int64_t> TorchChunkSizes(int64_t total, int chunks) {
  std::vector<int64_t> sizes(chunks, 0);
  if (total == 0) return sizes;
  const int64_t each = (total + chunks - 1) / chunks;
  int64_t left = total;
  for (int i = 0; i < chunks && left > 0; ++i) {
    sizes[i] = std::min(each, left);
    left -= sizes[i];
  }
  return sizes;
}

std::vector<int64_t> ExclusiveOffsets(absl::Span<const int64_t> sizes) {
  std::vector<int64_t> offsets(sizes.size(), 0);
  int64_t acc = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    offsets[i] = acc;
    acc += sizes[i];
  }
  return offsets;
}

absl::StatusOr<std::vector<int64_t>> ResolveSplits(
    absl::Span<const int64_t> splits, int64_t dim0, int world,
    const char* what) {
  if (splits.empty()) {
    if (dim0 % world != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("alltoall_base: ", what, " dim 0 (", dim0,
                       ") is not divisible by world size ", world,
                       " and no split sizes were given"));
    }
    return std::vector<int64_t>(world, dim0 / world);
  }
  if (static_cast<int>(splits.size()) != world) {
    return absl::InvalidArgumentError(
        absl::StrCat("alltoall_base: ", what, " split list has ",
                     splits.size(), " entries, world size is ", world));
  }
  int64_t sum = 0;
  for (int64_t s : splits) {
    if (s < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("alltoall_base: negative ", what, " split ", s));
    }
    sum += s;
  }
  if (sum != dim0) {
    return absl::InvalidArgumentError(
        absl::StrCat("alltoall_base: ", what, " splits sum to ", sum,
                     " but dim 0 is ", dim0));
  }
  return std::vector<int64_t>(splits.begin(), splits.end());
}

int64_t AlltoallPhases(absl::Span<const int64_t> bytes, int world,
                       int64_t per_pair_capacity) {
  int64_t phases = 1;
  for (int64_t b : bytes) {
    phases = std::max(phases, NumChunks(b, per_pair_capacity));
  }
  return phases;
}

}  // namespace tpudist::collectives
