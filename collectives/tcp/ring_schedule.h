// Pure chunk, segment and peer arithmetic for the ring algorithms in
// ring_algorithms.h. Nothing here does I/O; every function is a total
// function of its arguments, so the whole schedule is unit-tested in
// ring_schedule_test.cc without sockets.
//
// Conventions: ranks are 0..size-1; the ring sends "forward", from rank r to
// RingNext(r) and receives from RingPrev(r). A block is a Range
// (collectives/core/chunking.h) in whatever unit the caller uses (elements
// for the reducing algorithms, bytes for the copying ones).
//
// Thread-safety: all functions are pure and thread-safe.

#ifndef TPU_DIST_COLLECTIVES_TCP_RING_SCHEDULE_H_
#define TPU_DIST_COLLECTIVES_TCP_RING_SCHEDULE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "collectives/core/chunking.h"

namespace tpudist::collectives::tcp {

// Default upper bound on one transfer of the segmented ring all-reduce, as in
// Gloo's ring: big enough to amortize a syscall round trip, small enough that
// two segments fit in the kernel's socket buffers.
inline constexpr size_t kDefaultMaxSegmentBytes = size_t{1} << 20;

// (rank + delta) mod size for any (possibly negative) delta.
// REQUIRES: size > 0, 0 <= rank < size.
int RingRank(int rank, int size, long delta);
inline int RingNext(int rank, int size) { return RingRank(rank, size, 1); }
inline int RingPrev(int rank, int size) { return RingRank(rank, size, -1); }

// Splits `count` units into `parts` contiguous blocks whose lengths differ by
// at most one; the first count % parts blocks get the extra unit. Blocks are
// returned in order and tile [0, count) exactly (EvenSlice for every index).
// REQUIRES: parts > 0, count >= 0.
std::vector<Range> PartitionEven(int64_t count, int parts);

// Contiguous blocks with the given lengths, laid out back to back from 0.
std::vector<Range> BlocksFromLengths(absl::Span<const size_t> lengths);

// Sum of `lengths`.
size_t TotalLength(absl::Span<const size_t> lengths);

// Number of segments needed so that no segment of a block of `length` units of
// `unit_bytes` bytes each exceeds `max_segment_bytes` (at least one unit per
// segment, and at least one segment, even for an empty block).
// REQUIRES: unit_bytes > 0, max_segment_bytes > 0.
size_t NumSegments(size_t length, size_t unit_bytes, size_t max_segment_bytes);

// Segment `index` of `num_segments` even segments of `block` (EvenSlice
// applied inside the block, offsets absolute).
// REQUIRES: num_segments > 0, index < num_segments.
Range SegmentOf(const Range& block, size_t index, size_t num_segments);

// Ring reduce-scatter over `size` blocks, step `step` in [0, size - 2]: this
// rank sends block RsSendBlock and receives block RsRecvBlock, which it
// reduces into its own copy. After the last step rank r holds the full
// reduction of block r.
int RsSendBlock(int rank, int size, int step);
int RsRecvBlock(int rank, int size, int step);

// Ring all-gather, step `step` in [0, size - 2], starting with rank r owning
// block r: send block AgSendBlock, receive block AgRecvBlock.
int AgSendBlock(int rank, int size, int step);
int AgRecvBlock(int rank, int size, int step);

// Pairwise all-to-all, step `step` in [1, size - 1]: send to rank + step,
// receive from rank - step (mod size). Every ordered pair meets exactly once.
int AllToAllSendPeer(int rank, int size, int step);
int AllToAllRecvPeer(int rank, int size, int step);

// Chain broadcast from `root`: the chain is root, root+1, ..., root-1 (mod
// size). Position of `rank` in that chain (root is 0).
int ChainPosition(int rank, int size, int root);

}  // namespace tpudist::collectives::tcp

#endif  // TPU_DIST_COLLECTIVES_TCP_RING_SCHEDULE_H_
