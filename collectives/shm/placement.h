// Keeping a group's ranks on different cores when they have a core each.
//
// Why: ranks that hand phases to each other through futex wakes get pulled
// onto one core by the scheduler's wake-affine placement whenever the other
// cores are busy (other processes' builds next to 2 ranks on 2 cores: both
// ranks on CPU 0 at ~47% each, ps psr). Every phase then costs two context
// switches: a C++ 8 B all_reduce at 2 ranks took 7.3 us there against 1.8 us
// with the ranks pinned apart (bench/README.md, 2026-12-06 evening). Pinning
// is not ours to impose (a rank next to a busy core could not leave it), so
// a rank that keeps finding a lower-ranked peer on its own CPU moves itself
// once to a CPU no rank reports and gives its affinity mask straight back:
// the scheduler leaves a running thread where it is while its mask allows
// it, and may move it again later. Not while the rank's waits see a foreign
// load (Communicator::SawForeignLoad()): next to 2 busy processes per core
// moving made 16 MiB all_reduce slower (42-78 vs 11-23 ms, one run each).
//
// Thread-safety: ColocationTracker belongs to one Communicator (one op at a
// time); MoveToFreeCpu acts on the calling thread only.
#ifndef TPU_DIST_COLLECTIVES_SHM_PLACEMENT_H_
#define TPU_DIST_COLLECTIVES_SHM_PLACEMENT_H_

#include <cstdint>
#include <vector>

namespace tpudist::collectives::shm {

// When to move: after `phases_to_move` phases in a row that found a
// lower-ranked peer on this rank's CPU, and at most once per `min_interval_ns`.
struct ColocationTracker {
  int phases_to_move = 16;
  int64_t min_interval_ns = 20'000'000;  // 20 ms
  int colocated_phases = 0;
  int64_t last_move_ns = INT64_MIN / 2;
};

// Counts one phase (`colocated`: a lower-ranked peer reported this rank's
// CPU) at `now_ns`; true when the caller should move now (pure but for the
// tracker, which it updates).
bool ShouldMove(ColocationTracker& tracker, bool colocated, int64_t now_ns);

// Moves the calling thread to a CPU in its affinity mask that is not in
// `busy_cpus` (CPUs other ranks report), then restores the mask. False when
// there is no such CPU or a syscall failed (the mask is restored if it was
// changed).
bool MoveToFreeCpu(const std::vector<int>& busy_cpus);

}  // namespace tpudist::collectives::shm

#endif  // TPU_DIST_COLLECTIVES_SHM_PLACEMENT_H_
