#include "collectives/tcp/ring_schedule.h"

#include <algorithm>

namespace tpudist::collectives::tcp {

int RingRank(int rank, int size, long delta) {
  long r = (static_cast<long>(rank) + delta) % size;
  if (r < 0) r += size;
  return static_cast<int>(r);
}

std::vector<Range> PartitionEven(int64_t count, int parts) {
  std::vector<Range> blocks(static_cast<size_t>(parts));
  for (int i = 0; i < parts; ++i) blocks[i] = EvenSlice(count, parts, i);
  return blocks;
}

std::vector<Range> BlocksFromLengths(absl::Span<const size_t> lengths) {
  std::vector<Range> blocks(lengths.size());
  int64_t offset = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    blocks[i] = Range{offset, static_cast<int64_t>(lengths[i])};
    offset += blocks[i].size;
  }
  return blocks;
}

size_t TotalLength(absl::Span<const size_t> lengths) {
  size_t total = 0;
  for (size_t l : lengths) total += l;
  return total;
}

size_t NumSegments(size_t length, size_t unit_bytes, size_t max_segment_bytes) {
  const size_t units_per_segment = std::max<size_t>(1, max_segment_bytes / unit_bytes);
  return std::max<int64_t>(1, NumChunks(static_cast<int64_t>(length),
                                        static_cast<int64_t>(units_per_segment)));
}

Range SegmentOf(const Range& block, size_t index, size_t num_segments) {
  Range s = EvenSlice(block.size, static_cast<int64_t>(num_segments),
                      static_cast<int64_t>(index));
  s.begin += block.begin;
  return s;
}

int RsSendBlock(int rank, int size, int step) { return RingRank(rank, size, -(step + 1)); }
int RsRecvBlock(int rank, int size, int step) { return RingRank(rank, size, -(step + 2)); }
int AgSendBlock(int rank, int size, int step) { return RingRank(rank, size, -step); }
int AgRecvBlock(int rank, int size, int step) { return RingRank(rank, size, -(step + 1)); }

int AllToAllSendPeer(int rank, int size, int step) { return RingRank(rank, size, step); }
int AllToAllRecvPeer(int rank, int size, int step) { return RingRank(rank, size, -step); }

int ChainPosition(int rank, int size, int root) { return RingRank(rank, size, -root); }

}  // namespace tpudist::collectives::tcp
