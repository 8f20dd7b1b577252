// Intra-host collective algorithms over a shm::Communicator, on raw bytes.
//
// Every algorithm is a sequence of lock-step phases (see communicator.h). Its
// first phase carries each rank's OpHeader (collectives/core/op_header.h),
// which every rank checks against all the others before touching peer data,
// so mismatched calls fail on every rank with the same message. Every op runs
// at least one phase, even for zero elements. Algorithm-specific prose sits at
// the top of each function in algorithms.cc.
//
// Buffers: all pointers are caller-owned host memory that stays valid for the
// call. Inputs may alias outputs exactly where noted (in-place ops).
//
// Thread-safety: like Communicator, one op at a time.
#ifndef TPU_DIST_COLLECTIVES_SHM_ALGORITHMS_H_
#define TPU_DIST_COLLECTIVES_SHM_ALGORITHMS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "collectives/core/op_header.h"
#include "collectives/core/reduce_kernels.h"
#include "collectives/shm/communicator.h"

namespace tpudist::collectives::shm {

// In-place all-reduce of `count` elements at `data` ([count]). Messages of at
// most `small_bytes` (and every message when size() == 1) take the one-shot
// path (chunked if larger than a slot); larger ones a reduce-scatter +
// all-gather pipelined over slot-sized chunks, one phase per chunk plus one
// (all_reduce.cc).
absl::Status AllReduce(Communicator& comm, const OpSpec& spec, ReduceKind op,
                       void* data, int64_t small_bytes);

// Reduces every rank's `data` ([count]) into root's `data`; non-root buffers
// are left unchanged.
absl::Status Reduce(Communicator& comm, const OpSpec& spec, ReduceKind op,
                    int root, void* data);

// out ([count]) = reduction over ranks of their inputs[rank()] ; `inputs`
// holds size() buffers of `count` elements each. A rank's own block
// (inputs[rank()]) is read in place, not copied through its slot.
// REQUIRES: `out` is inputs[rank()] (in place) or overlaps no input.
absl::Status ReduceScatter(Communicator& comm, const OpSpec& spec,
                           ReduceKind op, absl::Span<const void* const> inputs,
                           void* out);

// outs[r] (bytes each) = rank r's `in` (bytes). `in` may alias outs[rank()].
absl::Status AllGather(Communicator& comm, const OpSpec& spec, const void* in,
                       int64_t bytes, absl::Span<void* const> outs);

// Root's `data` (bytes) is copied into every rank's `data`.
absl::Status Broadcast(Communicator& comm, const OpSpec& spec, int root,
                       void* data, int64_t bytes);

// On root, outs[r] (bytes) = rank r's `in`; `outs` is ignored elsewhere.
absl::Status Gather(Communicator& comm, const OpSpec& spec, int root,
                    const void* in, int64_t bytes,
                    absl::Span<void* const> outs);

// out (bytes) = root's ins[rank()]; `ins` is ignored on non-root ranks.
absl::Status Scatter(Communicator& comm, const OpSpec& spec, int root,
                     absl::Span<const void* const> ins, void* out,
                     int64_t bytes);

// outs[r] (out_bytes[r]) = rank r's ins[rank()] (its in_bytes[rank()]).
// Splits may be uneven; every (src, dst) pair must agree on the byte count
// (checked on every rank from the exchanged split matrix).
absl::Status AllToAll(Communicator& comm, const OpSpec& spec,
                      absl::Span<const void* const> ins,
                      absl::Span<const int64_t> in_bytes,
                      absl::Span<void* const> outs,
                      absl::Span<const int64_t> out_bytes);

// Returns once every rank has entered the barrier.
absl::Status Barrier(Communicator& comm, const OpSpec& spec);

}  // namespace tpudist::collectives::shm

#endif  // TPU_DIST_COLLECTIVES_SHM_ALGORITHMS_H_
