// Pure offset arithmetic shared by the shared-memory algorithms, the TCP ring
// schedule and the process group: the one half-open Range type, chunk
// boundaries, balanced slices, torch.chunk-style splits and uneven all-to-all
// offsets. No I/O, no state: every function here is a pure
// function of its arguments and is unit tested in chunking_test.cc.
//
// Thread-safety: all functions are pure and may be called concurrently.
#ifndef TPU_DIST_COLLECTIVES_CORE_CHUNKING_H_
#define TPU_DIST_COLLECTIVES_CORE_CHUNKING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tpudist::collectives {

// A half-open range [begin, begin + size) of elements (or bytes; the caller
// decides the unit).
struct Range {
  int64_t begin = 0;
  int64_t size = 0;
  int64_t end() const { return begin + size; }
  friend bool operator==(const Range& a, const Range& b) {
    return a.begin == b.begin && a.size == b.size;
  }
};

// Number of chunks of at most `chunk` units needed to cover `total` units.
// Zero when total == 0. REQUIRES: total >= 0, chunk > 0.
int64_t NumChunks(int64_t total, int64_t chunk);

// The `index`-th chunk of at most `chunk` units of a `total`-unit buffer; the
// last chunk may be shorter. REQUIRES: 0 <= index < NumChunks(total, chunk).
Range ChunkRange(int64_t total, int64_t chunk, int64_t index);

// Balanced split of `total` units into `parts` slices: the first
// total % parts slices get one extra unit, so sizes differ by at most one and
// the slices tile [0, total) in order. Used for "rank r reduces 1/W of each
// chunk". REQUIRES: parts > 0, 0 <= index < parts, total >= 0.
Range EvenSlice(int64_t total, int64_t parts, int64_t index);

// Slot layout of the one-phase-per-chunk all-reduce (shm::AllReduce): a slot
// of `slot_bytes` carries a chunk of `chunk_elems` elements at byte 0 and, at
// byte `result_offset` (64-aligned), one rank's reduced slice of the previous
// chunk: at most ceil(chunk_elems / world) elements. chunk_elems is the
// largest that fits. REQUIRES: world >= 1, 1 <= elem_size <= 8,
// slot_bytes >= 128 (then chunk_elems >= 1).
struct PipelinedLayout {
  int64_t chunk_elems = 0;
  int64_t result_offset = 0;
};
PipelinedLayout PipelinedAllReduceLayout(int64_t slot_bytes, int64_t elem_size, int world);

// Bytes of a slot the pipelined all-reduce uses per phase: the slot, but at
// most kAllReducePhaseMaxBytes. Measured on a quiet 2-core box (bench/README.md,
// "Session 2026-12-05, early morning"), 16 MiB fp32, per rank and phase:
// 16 ranks 128 KiB 58-62 ms, 256 KiB 48-49, 512 KiB 43-44, 1 MiB 42-46,
// 2 MiB 54 ms; 8 ranks 256 KiB 22-23 ms, 512 KiB 20-22; 4 ranks 512 KiB
// best or tied. Fewer phases mean fewer rounds of 16 context switches when
// ranks outnumber cores; beyond 512 KiB the phase's data leaves the cache.
// (An earlier sweep at load 17-20 had favoured 2 MiB / world, 128 KiB at 16
// ranks; on the quiet box that is 1.4x slower.) With 256 KiB slots (ranks
// <= cores) it is the slot. `world` is unused; kept for rules that depend on
// it. REQUIRES: world >= 1.
inline constexpr int64_t kAllReducePhaseMaxBytes = int64_t{512} << 10;
int64_t AllReducePhaseBytes(int64_t slot_bytes, int world);

// torch.chunk(x, chunks) sizes along one dimension of length `total`: every
// piece has ceil(total / chunks) units except a shorter last one, and fewer
// than `chunks` pieces may exist. The result always has `chunks` entries; the
// missing trailing pieces have size 0. REQUIRES: chunks > 0, total >= 0.
std::vector<int64_t> TorchChunkSizes(int64_t total, int chunks);

// Exclusive prefix sums: offsets[i] = sum(sizes[0..i)). Same length as sizes.
std::vector<int64_t> ExclusiveOffsets(absl::Span<const int64_t> sizes);

// Resolves an alltoall split list the way c10d does: an empty list means an
// even split of `dim0` rows over `world` ranks (dim0 must be divisible by
// world); a non-empty list must have `world` non-negative entries summing to
// dim0. Errors are InvalidArgument naming `what` ("input" / "output").
absl::StatusOr<std::vector<int64_t>> ResolveSplits(
    absl::Span<const int64_t> splits, int64_t dim0, int world,
    const char* what);

// Number of lock-step phases an alltoall needs when every (src, dst) pair
// carries at most `per_pair_capacity` bytes per phase: the max over the
// `world x world` row-major byte matrix of ceil(bytes / capacity), at least
// one. REQUIRES: per_pair_capacity > 0, bytes.size() == world * world.
int64_t AlltoallPhases(absl::Span<const int64_t> bytes, int world,
                       int64_t per_pair_capacity);

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_CORE_CHUNKING_H_
