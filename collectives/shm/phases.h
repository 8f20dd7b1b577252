// The lock-step phase driver shared by the shm algorithms (algorithms.cc,
// all_reduce.cc), and their byte-pointer helpers. Internal to collectives/shm.
//
// Thread-safety: like Communicator, one op at a time.
#ifndef TPU_DIST_COLLECTIVES_SHM_PHASES_H_
#define TPU_DIST_COLLECTIVES_SHM_PHASES_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "collectives/core/op_header.h"
#include "collectives/shm/communicator.h"

namespace tpudist::collectives::shm::internal {

inline char* At(void* p, int64_t off) { return static_cast<char*>(p) + off; }
inline const char* At(const void* p, int64_t off) {
  return static_cast<const char*>(p) + off;
}

// Drives `phases` (>= 1) lock-step phases. write(i, my_slot) fills this
// rank's slot for phase i; read(i) consumes peers' slots of phase i. The
// header goes out with phase 0 and is checked before read(0).
template <typename Write, typename Read>
absl::Status RunPhases(Communicator& comm, const OpSpec& spec,
                       const OpHeader& header, int64_t phases, Write write,
                       Read read) {
  phases = std::max<int64_t>(phases, 1);
  for (int64_t i = 0; i < phases; ++i) {
    if (absl::Status s = comm.BeginPhase(spec.ctx); !s.ok()) return s;
    if (i == 0) *comm.my_header() = header;
    write(i, comm.my_data());
    if (absl::Status s = comm.PublishAndWait(spec.ctx); !s.ok()) return s;
    if (i == 0) {
      if (absl::Status s = comm.CheckHeaders(spec.ctx); !s.ok()) return s;
    }
    if (absl::Status s = read(i); !s.ok()) return comm.Poison(s);
  }
  return absl::OkStatus();
}

// Every rank's slot of the current phase, offset by `off` bytes: [size()].
inline std::vector<const void*> PeerSlots(const Communicator& comm, int64_t off) {
  std::vector<const void*> v(comm.size());
  for (int r = 0; r < comm.size(); ++r) v[r] = At(comm.peer_data(r), off);
  return v;
}

}  // namespace tpudist::collectives::shm::internal

#endif  // TPU_DIST_COLLECTIVES_SHM_PHASES_H_
