// A competing CPU load started and stopped by a benchmark itself, so that a
// "with load" figure is reproducible instead of depending on whoever else
// shares the machine.
//
//   absl::StatusOr<BusyLoad> load = BusyLoad::Start(/*per_core=*/2);
//   ... run the benchmark ...
//   load->Stop();   // or let the destructor do it
//
// Each busy process spins on the CPU (no memory traffic beyond its stack) at
// normal priority. The processes die with their starter: Stop() / the
// destructor SIGKILL and reap them, and each one also has
// PR_SET_PDEATHSIG(SIGKILL) and polls its parent pid, so a starter that
// crashes or is killed leaves none behind.
//
// Fork before any thread is started (like ForkRanks): the children only run
// the spin loop, but a fork from a threaded process is still best avoided.
//
// Thread-safety: an object is used by one thread. Only the process that
// started the load stops it (a forked copy of the object does nothing).
#ifndef TPU_DIST_BENCH_BUSY_LOAD_H_
#define TPU_DIST_BENCH_BUSY_LOAD_H_

#include <sys/types.h>

#include <vector>

#include "absl/status/statusor.h"

namespace tpudist::bench {

class BusyLoad {
 public:
  BusyLoad() = default;  // no load
  // Starts per_core x (usable cores, sched_getaffinity) busy processes. per_core <= 0: none.
  // Error if a fork fails (the ones already started are stopped).
  static absl::StatusOr<BusyLoad> Start(int per_core);

  BusyLoad(BusyLoad&& other) noexcept;
  BusyLoad& operator=(BusyLoad&& other) noexcept;
  BusyLoad(const BusyLoad&) = delete;
  BusyLoad& operator=(const BusyLoad&) = delete;
  ~BusyLoad() { Stop(); }

  // Kills and reaps every busy process; idempotent.
  void Stop();
  int processes() const { return static_cast<int>(pids_.size()); }
  const std::vector<pid_t>& pids() const { return pids_; }

 private:
  pid_t owner_ = 0;  // the starter; copies in forked children do nothing
  std::vector<pid_t> pids_;
};

}  // namespace tpudist::bench

#endif  // TPU_DIST_BENCH_BUSY_LOAD_H_
