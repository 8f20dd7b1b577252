#include "collectives/shm/placement.h"

#include <sched.h>

namespace tpudist::collectives::shm {

bool ShouldMove(ColocationTracker& tracker, bool colocated, int64_t now_ns) {
  if (!colocated) {
    tracker.colocated_phases = 0;
    return false;
  }
  if (++tracker.colocated_phases < tracker.phases_to_move) return false;
  tracker.colocated_phases = 0;
  if (now_ns - tracker.last_move_ns < tracker.min_interval_ns) return false;
  tracker.last_move_ns = now_ns;
  return true;
}

bool MoveToFreeCpu(const std::vector<int>& busy_cpus) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return false;
  const int here = sched_getcpu();
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (c == here || !CPU_ISSET(c, &allowed)) continue;
    bool busy = false;
    for (int b : busy_cpus) busy = busy || b == c;
    if (busy) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) return false;
    // The thread now runs on c; the full mask lets it stay there.
    return sched_setaffinity(0, sizeof(allowed), &allowed) == 0;
  }
  return false;
}

}  // namespace tpudist::collectives::shm
