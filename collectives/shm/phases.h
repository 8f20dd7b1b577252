// The phase drivers (lock-step, and running ahead next to a busy load)
// shared by the shm algorithms (algorithms.cc, all_reduce.cc), and their
// byte-pointer helpers. Internal to collectives/shm.
//
// Thread-safety: like Communicator, one op at a time.
#ifndef TPU_DIST_COLLECTIVES_SHM_PHASES_H_
#define TPU_DIST_COLLECTIVES_SHM_PHASES_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "collectives/core/op_header.h"
#include "collectives/shm/communicator.h"

namespace tpudist::collectives::shm::internal {

inline char* At(void* p, int64_t off) { return static_cast<char*>(p) + off; }
inline const char* At(const void* p, int64_t off) {
  return static_cast<const char*>(p) + off;
}

// How far a rank may write ahead of its reads in the phases after a
// lock-step phase whose headers carry each rank's SawForeignLoad() (its
// peer_header()s are current): num_slots / 2 if any rank saw a foreign load
// and there are at least 4 slots, else 1 (lock-step). Every rank computes
// the same value from the same headers.
inline int AgreedLead(const Communicator& comm) {
  if (comm.num_slots() < 4) return 1;
  for (int r = 0; r < comm.size(); ++r) {
    if (comm.peer_header(r)->saw_foreign_load != 0) return comm.num_slots() / 2;
  }
  return 1;
}

// Runs phases [first, last) of an op whose phase first - 1 was the last
// lock-step phase this rank published (and read). write(i, my_slot) fills
// this rank's slot for phase i; read(i) consumes peers' slots of phase i
// (peer_data() reads phase i). lead 1: lock-step phases. lead L > 1 (L <=
// num_slots / 2, as AgreedLead gives): no group barrier; a rank writes
// phase i once it has read phase i - L (write(i) must not depend on read(j)
// for j > i - L) and reads phase i once every peer has published it, so it
// runs up to L phases ahead of the slowest peer -- next to a busy load, one
// scheduling round per L phases instead of one per phase. Slot reuse needs
// no wait: writing phase i reuses the slot of i - K (K = num_slots), which
// a peer has read once it has published i - K + L <= i - L, and this rank
// saw that when it read i - L. The op ends with every rank having read
// phase last - 1, and with L < K a peer's last unread phase is > last - 1 - L
// >= last - K: the next op's first slot is free, as the lock-step protocol
// assumes.
template <typename Write, typename Read>
absl::Status RunPhasesAhead(Communicator& comm, const OpSpec& spec, int64_t first,
                            int64_t last, int lead, Write write, Read read) {
  if (lead <= 1) {
    for (int64_t i = first; i < last; ++i) {
      if (absl::Status s = comm.BeginPhase(spec.ctx); !s.ok()) return s;
      write(i, comm.my_data());
      if (absl::Status s = comm.PublishAndWait(spec.ctx); !s.ok()) return s;
      if (absl::Status s = read(i); !s.ok()) return comm.Poison(s);
    }
    return absl::OkStatus();
  }
  const uint64_t base = comm.phase() - static_cast<uint64_t>(first - 1);  // phase i is base + i
  int64_t written = first;  // next phase to write
  for (int64_t i = first; i < last; ++i) {
    for (; written < last && written < i + lead; ++written) {
      if (absl::Status s = comm.BeginPhase(spec.ctx); !s.ok()) return s;
      write(written, comm.my_data());
      if (absl::Status s = comm.PublishNext(spec.ctx); !s.ok()) return s;
    }
    const uint64_t phase = base + static_cast<uint64_t>(i);
    for (int r = 0; r < comm.size(); ++r) {
      if (r == comm.rank()) continue;
      if (absl::Status s = comm.WaitPeerPublished(r, phase, spec.ctx); !s.ok()) return s;
    }
    comm.ReadFrom(phase);
    if (absl::Status s = read(i); !s.ok()) return comm.Poison(s);
  }
  return absl::OkStatus();
}

// Drives `phases` (>= 1) phases: phase 0 lock-step, carrying the header
// (checked before read(0)) and SawForeignLoad(); the rest as
// RunPhasesAhead with AgreedLead. write(i, my_slot) fills this rank's slot
// for phase i and must not depend on read(j) for j > i - num_slots / 2;
// read(i) consumes peers' slots of phase i. phase0_bytes: the most bytes
// write(0) puts into the slot on any rank (from the header's fields, so
// every rank gets the same value), or -1 when unknown; a one-phase op whose
// phase0_bytes fits comm.fastbox_bytes() runs in the fastbox line.
template <typename Write, typename Read>
absl::Status RunPhases(Communicator& comm, const OpSpec& spec, OpHeader header,
                       int64_t phases, Write write, Read read, int64_t phase0_bytes = -1) {
  phases = std::max<int64_t>(phases, 1);
  const bool fast = phases == 1 && phase0_bytes >= 0 && phase0_bytes <= comm.fastbox_bytes();
  if (absl::Status s = comm.BeginPhase(spec.ctx, fast); !s.ok()) return s;
  header.saw_foreign_load = comm.SawForeignLoad() ? 1 : 0;
  comm.SetHeader(header);
  write(0, comm.my_data());
  if (absl::Status s = comm.PublishAndWait(spec.ctx); !s.ok()) return s;
  if (absl::Status s = comm.CheckHeaders(spec.ctx); !s.ok()) return s;
  if (absl::Status s = read(0); !s.ok()) return comm.Poison(s);
  if (phases == 1) return absl::OkStatus();
  return RunPhasesAhead(comm, spec, 1, phases, AgreedLead(comm), write, read);
}

// Every rank's slot of the current phase, offset by `off` bytes: [size()]
// (inline up to 16 ranks: no allocation per phase).
using SlotPointers = absl::InlinedVector<const void*, 16>;
inline SlotPointers PeerSlots(const Communicator& comm, int64_t off) {
  SlotPointers v(comm.size());
  for (int r = 0; r < comm.size(); ++r) v[r] = At(comm.peer_data(r), off);
  return v;
}

}  // namespace tpudist::collectives::shm::internal

#endif  // TPU_DIST_COLLECTIVES_SHM_PHASES_H_
