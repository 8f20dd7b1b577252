#include "collectives/shm/algorithms.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/core/chunking.h"
#include "collectives/shm/phases.h"

namespace tpudist::collectives::shm {

using internal::AgreedLead;
using internal::At;
using internal::PeerSlots;
using internal::RunPhases;
using internal::RunPhasesAhead;

absl::Status Reduce(Communicator& comm, const OpSpec& spec, ReduceKind op,
                    int root, void* data) {
  // Chunked copy-in by the non-roots; after each sync the root reduces its
  // own buffer (read in place, never copied) and the W - 1 peers' slots, in
  // rank order, into its buffer. Non-roots just keep their slots valid until
  // the next phase.
  const size_t es = ElementSize(spec.dtype);
  const int64_t slot_elems = comm.slot_bytes() / static_cast<int64_t>(es);
  return RunPhases(
      comm, spec, MakeHeader(spec, OpKind::kReduce, op, root, true),
      NumChunks(spec.count, slot_elems),
      [&](int64_t i, void* slot) {
        if (spec.count == 0 || comm.rank() == root) return;
        const Range c = ChunkRange(spec.count, slot_elems, i);
        std::memcpy(slot, At(data, c.begin * es), c.size * es);
      },
      [&](int64_t i) {
        if (comm.rank() != root || spec.count == 0) return absl::OkStatus();
        const Range c = ChunkRange(spec.count, slot_elems, i);
        char* own = At(data, c.begin * es);
        internal::SlotPointers srcs = PeerSlots(comm, 0);
        srcs[root] = own;
        ReduceInto(spec.dtype, op, own, srcs, c.size);
        return absl::OkStatus();
      },
      spec.count * static_cast<int64_t>(es));
}

absl::Status ReduceScatter(Communicator& comm, const OpSpec& spec,
                           ReduceKind op, absl::Span<const void* const> inputs,
                           void* out) {
  // The slot is split into W sub-slots of `sub` elements, one per
  // destination. Each phase a rank copies the next `sub` elements of
  // inputs[j] into sub-slot j for every j != rank; after the sync rank r
  // reduces sub-slot r of the W - 1 peers and its own inputs[r], read in
  // place (in rank order, as if it were a slot), into its output. A rank
  // copies (W - 1)/W of its input instead of all of it; no all-gather step.
  const size_t es = ElementSize(spec.dtype);
  const int world = comm.size();
  const int me = comm.rank();
  // A whole input that fits a fastbox goes there in one phase: sub-slots
  // of exactly the output's size.
  const int64_t in_bytes = spec.count * world * static_cast<int64_t>(es);
  const bool small = in_bytes <= comm.fastbox_bytes();
  const int64_t sub = small ? std::max<int64_t>(spec.count, 1)
                            : comm.slot_bytes() / world / static_cast<int64_t>(es);
  return RunPhases(
      comm, spec, MakeHeader(spec, OpKind::kReduceScatter, op, -1, true),
      NumChunks(spec.count, sub),
      [&](int64_t i, void* slot) {
        if (spec.count == 0) return;
        const Range c = ChunkRange(spec.count, sub, i);
        for (int j = 0; j < world; ++j) {
          if (j == me) continue;
          std::memcpy(At(slot, j * sub * es), At(inputs[j], c.begin * es),
                      c.size * es);
        }
      },
      [&](int64_t i) {
        if (spec.count == 0) return absl::OkStatus();
        const Range c = ChunkRange(spec.count, sub, i);
        internal::SlotPointers srcs = PeerSlots(comm, me * sub * es);
        srcs[me] = At(inputs[me], c.begin * es);
        ReduceInto(spec.dtype, op, At(out, c.begin * es), srcs, c.size);
        return absl::OkStatus();
      },
      small ? in_bytes : -1);
}

absl::Status AllGather(Communicator& comm, const OpSpec& spec, const void* in,
                       int64_t bytes, absl::Span<void* const> outs) {
  // Chunked copy-in of the own piece; after each sync every rank copies
  // every slot (its own included, which makes in == outs[rank] safe) out.
  const int64_t chunk = comm.slot_bytes();
  return RunPhases(
      comm, spec, MakeHeader(spec, OpKind::kAllgather, ReduceKind{}, -1, true),
      NumChunks(bytes, chunk),
      [&](int64_t i, void* slot) {
        if (bytes == 0) return;
        const Range c = ChunkRange(bytes, chunk, i);
        std::memcpy(slot, At(in, c.begin), c.size);
      },
      [&](int64_t i) {
        if (bytes == 0) return absl::OkStatus();
        const Range c = ChunkRange(bytes, chunk, i);
        for (int r = 0; r < comm.size(); ++r) {
          if (outs[r] == At(in, 0) && r == comm.rank()) continue;
          std::memcpy(At(outs[r], c.begin), comm.peer_data(r), c.size);
        }
        return absl::OkStatus();
      },
      bytes);
}

absl::Status Broadcast(Communicator& comm, const OpSpec& spec, int root,
                       void* data, int64_t bytes) {
  // Chunk 0 rides with the header in one lock-step phase (so mismatched
  // calls fail on every rank). The headers also carry each rank's
  // SawForeignLoad(); if any rank saw one, chunks 1.. stream
  // (communicator.h): the root copies chunk i into the slot of phase
  // base + i and publishes without a group barrier; each other rank waits
  // for that, copies it out and publishes. Before writing over the slot of
  // phase q the root waits for every reader to have published q (chunk 0's
  // slot: base + 1, since it is read after the lock-step phase). So the root
  // runs up to num_slots chunks ahead and a reader never waits for the other
  // readers: next to a busy load, one scheduling round per num_slots chunks
  // instead of one per chunk. A closing barrier restores the lock-step
  // invariant; readers copy the last chunk after it, as in a lock-step
  // phase. Otherwise (idle cores) chunks 1.. are lock-step phases: there the
  // root copies chunk i while readers copy chunk i - 1 and no wait is long
  // enough to sleep, where a root running ahead waits long at the end.
  const int64_t chunk = comm.slot_bytes();
  const int64_t chunks = NumChunks(bytes, chunk);
  const bool is_root = comm.rank() == root;
  const OpHeader header = MakeHeader(spec, OpKind::kBroadcast, ReduceKind{}, root, true);
  bool stream = false;
  absl::Status first = RunPhases(
      comm, spec, header, 1,
      [&](int64_t, void* slot) {
        if (!is_root || bytes == 0) return;
        std::memcpy(slot, data, ChunkRange(bytes, chunk, 0).size);
      },
      [&](int64_t) {
        if (!is_root && bytes > 0) std::memcpy(data, comm.peer_data(root), ChunkRange(bytes, chunk, 0).size);
        for (int r = 0; r < comm.size(); ++r) stream = stream || comm.peer_header(r)->saw_foreign_load != 0;
        return absl::OkStatus();
      },
      bytes);
  if (!first.ok() || chunks <= 1) return first;
  if (!stream) {
    for (int64_t i = 1; i < chunks; ++i) {
      const Range c = ChunkRange(bytes, chunk, i);
      if (absl::Status s = comm.BeginPhase(spec.ctx); !s.ok()) return s;
      if (is_root) std::memcpy(comm.my_data(), At(data, c.begin), c.size);
      if (absl::Status s = comm.PublishAndWait(spec.ctx); !s.ok()) return s;
      if (!is_root) std::memcpy(At(data, c.begin), comm.peer_data(root), c.size);
    }
    return absl::OkStatus();
  }
  const uint64_t base = comm.phase();
  const int64_t slots = comm.num_slots();
  for (int64_t i = 1; i < chunks; ++i) {
    const Range c = ChunkRange(bytes, chunk, i);
    if (is_root) {
      if (i >= slots) {
        const uint64_t read = base + static_cast<uint64_t>(std::max<int64_t>(i - slots, 1));
        for (int r = 0; r < comm.size(); ++r) {
          if (r == root) continue;
          if (absl::Status s = comm.WaitPeerPublished(r, read, spec.ctx); !s.ok()) return s;
        }
      }
      if (absl::Status s = comm.BeginPhase(spec.ctx); !s.ok()) return s;
      std::memcpy(comm.my_data(), At(data, c.begin), c.size);
    } else {
      if (absl::Status s = comm.WaitPeerPublished(root, base + i, spec.ctx); !s.ok()) return s;
      if (i + 1 < chunks) std::memcpy(At(data, c.begin), comm.peer_data_next(root), c.size);
    }
    if (absl::Status s = comm.PublishNext(spec.ctx); !s.ok()) return s;
  }
  if (absl::Status s = comm.WaitAllPublished(spec.ctx); !s.ok()) return s;
  if (!is_root) {
    const Range c = ChunkRange(bytes, chunk, chunks - 1);
    std::memcpy(At(data, c.begin), comm.peer_data(root), c.size);
  }
  return absl::OkStatus();
}

absl::Status Gather(Communicator& comm, const OpSpec& spec, int root,
                    const void* in, int64_t bytes,
                    absl::Span<void* const> outs) {
  // Like AllGather, but only the root copies the slots out, and its own
  // piece goes from `in` to outs[root] directly (no slot).
  const int64_t chunk = comm.slot_bytes();
  const bool is_root = comm.rank() == root;
  return RunPhases(
      comm, spec, MakeHeader(spec, OpKind::kGather, ReduceKind{}, root, true),
      NumChunks(bytes, chunk),
      [&](int64_t i, void* slot) {
        if (bytes == 0 || is_root) return;
        const Range c = ChunkRange(bytes, chunk, i);
        std::memcpy(slot, At(in, c.begin), c.size);
      },
      [&](int64_t i) {
        if (!is_root || bytes == 0) return absl::OkStatus();
        const Range c = ChunkRange(bytes, chunk, i);
        for (int r = 0; r < comm.size(); ++r) {
          const void* src = r == root ? At(in, c.begin) : comm.peer_data(r);
          if (At(outs[r], c.begin) != src) std::memmove(At(outs[r], c.begin), src, c.size);
        }
        return absl::OkStatus();
      },
      bytes);
}

absl::Status Scatter(Communicator& comm, const OpSpec& spec, int root,
                     absl::Span<const void* const> ins, void* out,
                     int64_t bytes) {
  // The root's slot holds W sub-slots of `sub` bytes; phase i carries bytes
  // [i*sub, (i+1)*sub) of every destination's piece. Rank r copies sub-slot
  // r of the root's slot; the root copies its own piece from ins[root]
  // directly (its sub-slot stays unused).
  const int world = comm.size();
  const int64_t sub = comm.slot_bytes() / world;
  const bool is_root = comm.rank() == root;
  return RunPhases(
      comm, spec, MakeHeader(spec, OpKind::kScatter, ReduceKind{}, root, true),
      NumChunks(bytes, sub),
      [&](int64_t i, void* slot) {
        if (!is_root || bytes == 0) return;
        const Range c = ChunkRange(bytes, sub, i);
        for (int j = 0; j < world; ++j) {
          if (j != root) std::memcpy(At(slot, j * sub), At(ins[j], c.begin), c.size);
        }
      },
      [&](int64_t i) {
        if (bytes == 0) return absl::OkStatus();
        const Range c = ChunkRange(bytes, sub, i);
        const void* src = is_root ? At(ins[root], c.begin)
                                  : At(comm.peer_data(root), comm.rank() * sub);
        if (At(out, c.begin) != src) std::memmove(At(out, c.begin), src, c.size);
        return absl::OkStatus();
      });
}

absl::Status AllToAll(Communicator& comm, const OpSpec& spec,
                      absl::Span<const void* const> ins,
                      absl::Span<const int64_t> in_bytes,
                      absl::Span<void* const> outs,
                      absl::Span<const int64_t> out_bytes) {
  // Phase 0 exchanges every rank's send and receive byte counts (2W int64),
  // giving every rank the full W x W matrix; a pair whose counts disagree
  // fails on every rank. A rank's own block is one direct memcpy; data
  // phases 1..P then move up to `sub` bytes per (src, dst) pair, src != dst:
  // src copies its next piece for dst into its sub-slot for dst (one of
  // W - 1: the self pair takes no slot space, which halves the phases at
  // W = 2), and dst copies its sub-slot of every src out. P is the same
  // everywhere because it is computed from the shared matrix with its
  // diagonal zeroed (AlltoallPhases).
  const int world = comm.size();
  const int me = comm.rank();
  const int peers = std::max(world - 1, 1);
  int64_t sub = (comm.slot_bytes() / peers) & ~int64_t{63};
  if (sub == 0) sub = comm.slot_bytes() / peers;
  // Index of `dst` among `src`'s W - 1 peers (REQUIRES src != dst).
  auto sub_slot = [](int src, int dst) { return dst < src ? dst : dst - 1; };
  std::vector<int64_t> matrix(world * world);  // [src][dst] bytes
  const OpHeader header = MakeHeader(spec, OpKind::kAlltoall, ReduceKind{}, -1, false);
  absl::Status exchanged = RunPhases(
      comm, spec, header, 1,
      [&](int64_t, void* slot) {
        int64_t* v = static_cast<int64_t*>(slot);
        for (int j = 0; j < world; ++j) {
          v[j] = in_bytes[j];
          v[world + j] = out_bytes[j];
        }
      },
      [&](int64_t) {
        for (int src = 0; src < world; ++src) {
          const int64_t* v = static_cast<const int64_t*>(comm.peer_data(src));
          for (int dst = 0; dst < world; ++dst) matrix[src * world + dst] = v[dst];
        }
        for (int dst = 0; dst < world; ++dst) {
          const int64_t* v = static_cast<const int64_t*>(comm.peer_data(dst));
          for (int src = 0; src < world; ++src) {
            if (v[world + src] != matrix[src * world + dst]) {
              return absl::InvalidArgumentError(absl::StrCat(
                  spec.ctx.name, " on rank ", me, ": rank ", src, " sends ",
                  matrix[src * world + dst], " bytes to rank ", dst,
                  " which expects ", v[world + src], " bytes"));
            }
          }
        }
        return absl::OkStatus();
      },
      2 * world * static_cast<int64_t>(sizeof(int64_t)));
  if (!exchanged.ok()) return exchanged;
  const int64_t self_bytes = matrix[me * world + me];
  // memmove: a caller may pass views of one buffer whose own blocks overlap.
  if (self_bytes > 0 && outs[me] != ins[me]) std::memmove(outs[me], ins[me], self_bytes);
  std::vector<int64_t> off_diagonal = matrix;
  for (int r = 0; r < world; ++r) off_diagonal[r * world + r] = 0;
  const int64_t phases = AlltoallPhases(off_diagonal, world, sub);
  // Data phase k is phase k + 1 after the exchange (which agreed the lead).
  return RunPhasesAhead(
      comm, spec, 1, phases + 1, AgreedLead(comm),
      [&](int64_t i, void* slot) {
        const int64_t off = (i - 1) * sub;
        for (int j = 0; j < world; ++j) {
          if (j == me) continue;
          const int64_t n = std::clamp<int64_t>(matrix[me * world + j] - off, 0, sub);
          if (n > 0) std::memcpy(At(slot, sub_slot(me, j) * sub), At(ins[j], off), n);
        }
      },
      [&](int64_t i) {
        const int64_t off = (i - 1) * sub;
        for (int r = 0; r < world; ++r) {
          if (r == me) continue;
          const int64_t n = std::clamp<int64_t>(matrix[r * world + me] - off, 0, sub);
          if (n > 0) std::memcpy(At(outs[r], off), At(comm.peer_data(r), sub_slot(r, me) * sub), n);
        }
        return absl::OkStatus();
      });
}

absl::Status Barrier(Communicator& comm, const OpSpec& spec) {
  // One header-only phase: returning from PublishAndWait means every rank
  // has published it, i.e. has entered the barrier.
  return RunPhases(
      comm, spec, MakeHeader(spec, OpKind::kBarrier, ReduceKind{}, -1, true), 1,
      [](int64_t, void*) {}, [](int64_t) { return absl::OkStatus(); }, 0);
}

}  // namespace tpudist::collectives::shm
