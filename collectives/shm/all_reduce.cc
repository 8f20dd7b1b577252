// shm::AllReduce (declared in algorithms.h): a one-shot path for small
// messages and a pipelined reduce-scatter + all-gather, one phase per chunk,
// for large ones.
#include <cstring>
#include <vector>

#include "collectives/core/chunking.h"
#include "collectives/core/stream_copy.h"
#include "collectives/shm/algorithms.h"
#include "collectives/shm/phases.h"

namespace tpudist::collectives::shm {

using internal::AgreedLead;
using internal::At;
using internal::PeerSlots;
using internal::RunPhases;
using internal::RunPhasesAhead;

namespace {

void CopyBytes(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

// One-shot, per chunk of a whole slot: every rank copies the chunk into its
// slot, publishes, and then reduces all W slots (in rank order, so results
// are identical on every rank) straight into its own buffer. One sync per
// chunk; the rotating slots replace a trailing barrier. Only for small
// messages: every rank reads all W slots. (Measured at W = 2, 16 MiB:
// 1.2-1.9x slower than reduce-scatter + all-gather, which reads only half of
// the peer's cache-hot data across cores.)
absl::Status OneShot(Communicator& comm, const OpSpec& spec, ReduceKind op,
                     const OpHeader& header, void* data) {
  const size_t es = ElementSize(spec.dtype);
  const int64_t slot_elems = comm.slot_bytes() / static_cast<int64_t>(es);
  return RunPhases(
      comm, spec, header, NumChunks(spec.count, slot_elems),
      [&](int64_t i, void* slot) {
        if (spec.count == 0) return;
        const Range c = ChunkRange(spec.count, slot_elems, i);
        std::memcpy(slot, At(data, c.begin * es), c.size * es);
      },
      [&](int64_t i) {
        if (spec.count == 0) return absl::OkStatus();
        const Range c = ChunkRange(spec.count, slot_elems, i);
        ReduceInto(spec.dtype, op, At(data, c.begin * es), PeerSlots(comm, 0), c.size);
        return absl::OkStatus();
      },
      spec.count * static_cast<int64_t>(es));
}

// Reduce-scatter + all-gather pipelined over chunks, ONE phase per chunk (a
// phase is a barrier, and a barrier costs each of W ranks a context switch
// when ranks outnumber cores). Each slot carries a chunk at byte 0 and, at
// layout.result_offset, this rank's reduced slice of chunk i - L
// (PipelinedAllReduceLayout of AllReducePhaseBytes: at most 512 KiB of each
// 2 MiB slot, so a phase's data stays cached). L is the lead the
// ranks agree on after phase 0 (phases.h): 1 (lock-step) unless a rank saw a
// foreign load. Phase i (0 <= i < chunks + L):
//   write: copy chunk i into the slot, but for my own slice of it (only I
//     reduce that one, reading it in place); copy my reduced slice of chunk i-L
//     (reduced into my buffer by read(i-L)) into the result area.
//   read:  reduce my EvenSlice(chunk i, W, rank) of my buffer and of the
//     W - 1 peers' slots into my buffer (in rank order: identical on every
//     rank); copy every peer's
//     reduced slice of chunk i-L out of its result area into my buffer.
// The chunk regions touched by read(i) (i and i-L) were both copied out of
// my buffer by write(i) / write(i-L) before, so reducing in place is safe.
// chunks + L phases instead of 2 per chunk. Results of messages of at least
// kStreamCopyMinBytes are copied out with streaming stores (stream_copy.h).
absl::Status Pipelined(Communicator& comm, const OpSpec& spec, ReduceKind op,
                       const OpHeader& header, void* data) {
  const size_t es = ElementSize(spec.dtype);
  const int world = comm.size();
  const int me = comm.rank();
  const PipelinedLayout layout =
      PipelinedAllReduceLayout(AllReducePhaseBytes(comm.slot_bytes(), world),
                               static_cast<int64_t>(es), world);
  const int64_t chunks = NumChunks(spec.count, layout.chunk_elems);
  auto chunk = [&](int64_t i) { return ChunkRange(spec.count, layout.chunk_elems, i); };
  // A large result will have left the cache before the caller reads it:
  // write it with streaming stores (no read-for-ownership of the old data).
  void (*copy_out)(void*, const void*, size_t) =
      UseStreamCopy(spec.count * static_cast<int64_t>(es)) ? &StreamCopy : &CopyBytes;
  int lead = 1;  // agreed after phase 0, which neither reads nor writes results
  auto write = [&](int64_t i, void* slot) {
    if (i < chunks) {  // chunk i but my own slice, which only I reduce
      const Range c = chunk(i);
      const Range s = EvenSlice(c.size, world, me);
      std::memcpy(slot, At(data, c.begin * es), s.begin * es);
      const int64_t after = s.begin + s.size;
      std::memcpy(At(slot, after * es), At(data, (c.begin + after) * es),
                  (c.size - after) * es);
    }
    if (i >= lead && i - lead < chunks) {
      const Range c = chunk(i - lead);
      const Range s = EvenSlice(c.size, world, me);
      std::memcpy(At(slot, layout.result_offset), At(data, (c.begin + s.begin) * es),
                  s.size * es);
    }
  };
  auto read = [&](int64_t i) {
    if (i < chunks) {
      const Range c = chunk(i);
      const Range s = EvenSlice(c.size, world, me);
      char* own = At(data, (c.begin + s.begin) * es);
      internal::SlotPointers inputs = PeerSlots(comm, s.begin * es);
      inputs[me] = own;  // read in place: never copied into my slot
      ReduceInto(spec.dtype, op, own, inputs, s.size);
    }
    if (i >= lead && i - lead < chunks) {
      const Range c = chunk(i - lead);
      for (int r = 0; r < world; ++r) {
        if (r == me) continue;
        const Range s = EvenSlice(c.size, world, r);
        copy_out(At(data, (c.begin + s.begin) * es),
                 At(comm.peer_data(r), layout.result_offset), s.size * es);
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status s = RunPhases(comm, spec, header, 1, write, read); !s.ok()) return s;
  lead = AgreedLead(comm);
  return RunPhasesAhead(comm, spec, 1, chunks + lead, lead, write, read);
}

}  // namespace

absl::Status AllReduce(Communicator& comm, const OpSpec& spec, ReduceKind op,
                       void* data, int64_t small_bytes) {
  const int64_t bytes = spec.count * static_cast<int64_t>(ElementSize(spec.dtype));
  const OpHeader header = MakeHeader(spec, OpKind::kAllreduce, op, -1, true);
  if (bytes <= small_bytes || comm.size() == 1) {
    return OneShot(comm, spec, op, header, data);
  }
  return Pipelined(comm, spec, op, header, data);
}

}  // namespace tpudist::collectives::shm
