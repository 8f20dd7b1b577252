// The latency floor of one barrier among W processes: a bare futex barrier in
// an anonymous shared mapping, measured in the same run as the collectives
// (issue #16 goal 2: "8 B all_reduce at 16 ranks <= 50 us" is only
// meaningful next to what one barrier costs on the box).
//
//   FutexBarrier b = FutexBarrier::Create(world);   // before ForkRanks
//   ... every rank: b.Wait(rank) x N, timed on rank 0 ...
//
// The barrier is the cheapest protocol a lock-step collective phase can use:
// each arrival is one fetch_add on one shared word; the last arriver issues
// one FUTEX_WAKE (all sleepers) on that word when anyone sleeps; the others
// spin, then sched_yield, then FUTEX_WAIT on it (no spin when
// spin_iters == 0, as ranks > cores; no yields when yield_iters == 0). No
// checks, no headers, no data. Every wait has a deadline (Wait returns false
// when it passes).
//
// Thread-safety: one caller per process; the mapping is shared by the
// processes forked after Create.
#ifndef TPU_DIST_BENCH_FUTEX_BARRIER_H_
#define TPU_DIST_BENCH_FUTEX_BARRIER_H_

#include <atomic>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tpudist::bench {

class FutexBarrier {
 public:
  // Maps the shared word; call before forking the ranks that use it.
  // REQUIRES: world >= 1.
  static absl::StatusOr<FutexBarrier> Create(int world);
  FutexBarrier(FutexBarrier&& other) noexcept;
  FutexBarrier& operator=(FutexBarrier&&) = delete;
  ~FutexBarrier();

  // One barrier; every one of `world` processes calls it once per round.
  // Spins up to `spin_iters` loads and yields up to `yield_iters` times
  // before sleeping. False if `timeout` passed first (the barrier is then
  // unusable).
  bool Wait(int spin_iters, int yield_iters, absl::Duration timeout);

  // Runs `rounds` barriers (after one warm-up) and returns the mean seconds
  // per barrier as seen by this process, or -1 on a timeout.
  double TimeRounds(int rounds, int spin_iters, int yield_iters);

 private:
  struct Shared {
    alignas(64) std::atomic<uint32_t> arrivals;
    alignas(64) std::atomic<uint32_t> sleepers;
  };
  FutexBarrier(Shared* shared, int world) : shared_(shared), world_(world) {}
  Shared* shared_;
  int world_;
  uint32_t round_ = 0;  // rounds this process has entered
};

}  // namespace tpudist::bench

#endif  // TPU_DIST_BENCH_FUTEX_BARRIER_H_
