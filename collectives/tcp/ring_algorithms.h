// Bandwidth-oriented collectives over any Transport (TcpMesh between hosts,
// InMemoryTransport in tests), in the manner of Gloo's ring algorithms.
//
// All functions work on raw bytes. The reducing ones take an element size and
// a ReduceFn (collectives/core/reduce_kernels.h) that folds `count` elements
// of a received segment into the local buffer; they never look at dtypes, so
// the caller supplies one for its dtype and op (MakeReduceFn). Floating point
// sums are reduced in ring order, so bitwise results may differ from a serial
// sum in the last ulp. The schedules (which block, which segment, which peer) come from the
// pure functions in ring_schedule.h.
//
// Contract shared by every function:
//   * Collective: every rank of the transport calls the same function with
//     consistent arguments (same sizes, same root); otherwise the transport
//     reports a size mismatch or the call times out.
//   * Returns by `deadline`. On error the transport is poisoned (see
//     transport.h) and the output buffer contents are unspecified.
//   * Size 1 transports are fine (local work only); zero-byte payloads are
//     fine.
//   * Buffers are borrowed for the duration of the call only.
// Thread-safety: as the transport's, i.e. one collective at a time per
// transport.

#ifndef TPU_DIST_COLLECTIVES_TCP_RING_ALGORITHMS_H_
#define TPU_DIST_COLLECTIVES_TCP_RING_ALGORITHMS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "collectives/core/reduce_kernels.h"
#include "collectives/tcp/ring_schedule.h"
#include "collectives/tcp/transport.h"

namespace tpudist::collectives::tcp {

struct RingOptions {
  // Largest single transfer of the segmented all-reduce/reduce-scatter and of
  // the pipelined broadcast.
  size_t max_segment_bytes = kDefaultMaxSegmentBytes;
};

// In-place all-reduce of data ([count * element_size] bytes) with `reduce`:
// ring reduce-scatter then ring all-gather, 2(W-1) steps, 2(W-1)/W * S bytes
// sent per rank.
// REQUIRES: element_size > 0 and data.size() % element_size == 0.
absl::Status RingAllReduce(Transport& transport, absl::Span<uint8_t> data, size_t element_size,
                           const ReduceFn& reduce, absl::Time deadline,
                           const RingOptions& options = {});

// In-place ring reduce-scatter over W equal blocks: data is
// [W * block_count * element_size] bytes; on return block rank() holds the
// reduction of everyone's block rank(); the other blocks are scratch
// (clobbered).
// REQUIRES: data.size() % (W * element_size) == 0.
absl::Status RingReduceScatter(Transport& transport, absl::Span<uint8_t> data, size_t element_size,
                               const ReduceFn& reduce, absl::Time deadline,
                               const RingOptions& options = {});

// In-place ring all-gather of W equal blocks: data is [W * block_bytes]; on
// entry block rank() holds this rank's contribution; on return every block
// holds its owner's contribution.
// REQUIRES: data.size() % W == 0.
absl::Status RingAllGather(Transport& transport, absl::Span<uint8_t> data, absl::Time deadline);

// As RingAllGather with per-rank block sizes: block i is block_bytes[i]
// bytes, blocks laid out back to back in rank order.
// REQUIRES: block_bytes.size() == W and sum(block_bytes) == data.size().
absl::Status RingAllGatherV(Transport& transport, absl::Span<uint8_t> data,
                            absl::Span<const size_t> block_bytes, absl::Time deadline);

// Broadcast of data from `root` to every rank, pipelined in segments along
// the chain root -> root+1 -> ... -> root-1.
// REQUIRES: 0 <= root < W.
absl::Status RingBroadcast(Transport& transport, int root, absl::Span<uint8_t> data,
                           absl::Time deadline, const RingOptions& options = {});

// All-to-all with uneven sizes by pairwise exchange: input is the
// concatenation, in destination rank order, of send_bytes[j] bytes for each
// rank j; output receives recv_bytes[i] bytes from each rank i in source
// order. Rank i's send_bytes[j] must equal rank j's recv_bytes[i].
// REQUIRES: send_bytes.size() == recv_bytes.size() == W, the sums match the
// buffer sizes, send_bytes[rank()] == recv_bytes[rank()], and input and
// output do not overlap.
absl::Status AllToAll(Transport& transport, absl::Span<const uint8_t> input,
                      absl::Span<const size_t> send_bytes, absl::Span<uint8_t> output,
                      absl::Span<const size_t> recv_bytes, absl::Time deadline);

}  // namespace tpudist::collectives::tcp

#endif  // TPU_DIST_COLLECTIVES_TCP_RING_ALGORITHMS_H_
