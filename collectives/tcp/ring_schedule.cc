#include "collectives/tcp/ring_schedule.h"

#include <algorithm>

namespace tpudist::collectives::tcp {

int RingRank(int rank, int size, long delta) {
  long r = (static_cast<long>(rank) + delta) % size;
  if (r < 0) r += size;
  return static_cast<int>(r);
}

std::vector<Block> PartitionEven(size_t count, int parts) {
  std::vector<Block> blocks(static_cast<size_t>(parts));
  const size_t base = count / static_cast<size_t>(parts);
  const size_t extra = count % static_cast<size_t>(parts);
  size_t offset = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].offset = offset;
    blocks[i].length = base + (i < extra ? 1 : 0);
    offset += blocks[i].length;
  }
  return blocks;
}

std::vector<Block> BlocksFromLengths(absl::Span<const size_t> lengths) {
  std::vector<Block> blocks(lengths.size());
  size_t offset = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    blocks[i] = Block{offset, lengths[i]};
    offset += lengths[i];
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
  return std::max<size_t>(1, (length + units_per_segment - 1) / units_per_segment);
}

Block SegmentOf(const Block& block, size_t index, size_t num_segments) {
  const size_t base = block.length / num_segments;
  const size_t extra = block.length % num_segments;
  const size_t offset = index * base + std::min(index, extra);
  return Block{block.offset + offset, base + (index < extra ? 1 : 0)};
}

int RsSendBlock(int rank, int size, int step) { return RingRank(rank, size, -(step + 1)); }
int RsRecvBlock(int rank, int size, int step) { return RingRank(rank, size, -(step + 2)); }
int AgSendBlock(int rank, int size, int step) { return RingRank(rank, size, -step); }
int AgRecvBlock(int rank, int size, int step) { return RingRank(rank, size, -(step + 1)); }

int AllToAllSendPeer(int rank, int size, int step) { return RingRank(rank, size, step); }
int AllToAllRecvPeer(int rank, int size, int step) { return RingRank(rank, size, -step); }

int ChainPosition(int rank, int size, int root) { return RingRank(rank, size, -root); }

}  // namespace tpudist::collectives::tcp
