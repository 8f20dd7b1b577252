// Waiting on a 32-bit sequence word in shared memory without starving peers.
//
// A spin-wait steals the CPU from the very peer we are waiting for whenever
// that peer has no core of its own (16 ranks on 2 cores, or any ranks next to
// a busy load), so WaitForSeq backs off in three stages:
//   1. a bounded spin (policy.spin_iters iterations with _mm_pause),
//   2. a bounded run of sched_yield calls (policy.yield_iters), gated by a
//      YieldGate when one is passed (below),
//   3. FUTEX_WAIT on the shared word (non-private: the word lives in a
//      MAP_SHARED mapping seen by other processes), in slices of at most
//      policy.futex_slice so that `check` (peer liveness, abort flags) and the
//      deadline are looked at regularly.
// ChooseWaitPolicy picks the stages from how many ranks share the cores.
// Writers publish with PublishSeq, which issues FUTEX_WAKE only when the
// word's sleeper count is non-zero, so the fast path costs no syscall.
//
// The adaptive yield stage. A sched_yield hands the core to whatever else is
// runnable on it. When that is our own peer ranks (16 ranks on 2 cores, or 4
// ranks idle) they run for microseconds and hand it back: yielding beats a
// futex sleep + wake. When it is a foreign busy process, the yield gives it a
// whole time slice (milliseconds) after our peer is long done. So each yield
// is timed; a stage with a yield that took policy.slow_yield or longer is
// "slow". policy.slow_stages_to_close slow stages in a row close the
// caller's YieldGate (futex only) for a back-off that doubles while the
// probes that reopen it keep being slow and halves after each fast stage.
// One slow stage alone proves little: a rank is also preempted now and then
// by processes of other scheduling groups (sched_autogroup), which no futex
// sleep avoids; a hog in our own group makes every yield slow.
//
// Sequence numbers wrap: "reached" means (int32_t)(value - target) >= 0.
//
// Thread-safety: all functions are safe to call concurrently from any thread
// or process mapping the same words; a YieldGate belongs to one waiter
// (a Communicator: one op at a time).
#ifndef TPU_DIST_COLLECTIVES_SHM_WAIT_H_
#define TPU_DIST_COLLECTIVES_SHM_WAIT_H_

#include <atomic>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tpudist::collectives::shm {

// The stages of a wait. Build one with ChooseWaitPolicy; the fields are
// public for experiments (collectives_bench --spin / --yield /
// --adaptive_yield).
struct WaitPolicy {
  int spin_iters = 32;
  int yield_iters = 0;
  absl::Duration futex_slice = absl::Milliseconds(5);
  // Adaptive yield stage (with a YieldGate; false: plain yields, the gate
  // is ignored): a sched_yield that returned after slow_yield or more means
  // another process ran a slice; slow_stages_to_close such stages in a row
  // close the gate for yield_backoff_min, doubling up to yield_backoff_max
  // while it keeps happening.
  bool adaptive_yield = true;
  absl::Duration slow_yield = absl::Microseconds(250);
  int slow_stages_to_close = 3;
  absl::Duration yield_backoff_min = absl::Milliseconds(20);
  absl::Duration yield_backoff_max = absl::Seconds(1);
};

// The policy for `local_ranks` ranks sharing `usable_cores` cores (pure; the
// one place the choice is made). Measured with collectives_bench on the
// 2-core box (bench/README.md, "Waiting under load" and "Goal 2: adaptive
// yield"):
//   - plain sched_yield collapses next to busy competitors (a yielding rank
//     gives away whole time slices while the peer it waits for is already
//     done; 8 B all_reduce 8 ms), but beats the futex when the competitors
//     are our own ranks. So the yield stage is adaptive (YieldGate).
//   - ranks > cores: a waiting rank can only make progress by leaving the
//     core, so no spin: adaptive yields, then the futex.
//   - ranks <= cores: 32 spins catch a peer running right now, then the
//     adaptive yields, then the futex. (Without yields 1000 spins had won:
//     2 ranks idle 8 B 1.5 vs 5.5 us. With them, at load 15, 32 spins won:
//     geomean of 25 small cases 13 vs 52 us idle, 39 vs 146 us next to 2
//     busy processes per core: a long spin delays a peer on the same core.)
// REQUIRES: local_ranks >= 1, usable_cores >= 1.
WaitPolicy ChooseWaitPolicy(int local_ranks, int usable_cores);

// Whether a waiter may run its yield stage; see "The adaptive yield stage".
// Times are steady-clock nanoseconds (SteadyNanos()).
struct YieldGate {
  int64_t closed_until_ns = 0;  // no yield stage before this time
  int64_t backoff_ns = 0;       // length of the last closure, decaying; 0: none
  int slow_streak = 0;          // slow stages in a row (kept after a closure)
};

inline bool YieldGateOpen(const YieldGate& gate, int64_t now_ns) {
  return now_ns >= gate.closed_until_ns;
}

// The gate after a yield stage that ended at `now_ns` and whose slowest
// sched_yield took `slowest_yield_ns` (pure). Slow (>= policy.slow_yield):
// the streak grows; at policy.slow_stages_to_close the gate closes for
// max(yield_backoff_min, 2 x the last back-off), at most yield_backoff_max,
// and the streak stays one short of closing, so the probe after reopening
// closes it again if still slow. Fast: streak 0, the remembered back-off
// halves (dropping to 0 below yield_backoff_min).
YieldGate NextYieldGate(const YieldGate& gate, int64_t now_ns, int64_t slowest_yield_ns,
                        const WaitPolicy& policy);

// Monotonic clock in nanoseconds.
int64_t SteadyNanos();

// Cores this process may run on (sched_getaffinity), at least 1.
int UsableCores();

// True when `value` is at or past `target` in wrapping sequence order.
inline bool SeqReached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

// Blocks until SeqReached(word, target). `waiters` counts sleepers on `word`
// (shared with the writer). `gate` (null, or policy.adaptive_yield false:
// plain yields) makes the yield stage adaptive and is updated by it.
// `check` is called after every futex sleep that
// ended without the target reached (a slice ran out, or a wake such as the
// one Communicator::Poison sends), never on the way in, so a wait that ends
// on its first wake costs no check; a non-OK result ends the wait with that
// status. Returns DeadlineExceeded (bare message; callers
// add op / rank / peer context) when `deadline` passes first.
absl::Status WaitForSeq(const std::atomic<uint32_t>* word,
                        std::atomic<uint32_t>* waiters, uint32_t target,
                        absl::Time deadline, const WaitPolicy& policy,
                        YieldGate* gate,
                        absl::FunctionRef<absl::Status()> check);

// Stores `value` into `word` (release + full fence) and wakes sleepers.
void PublishSeq(std::atomic<uint32_t>* word, std::atomic<uint32_t>* waiters,
                uint32_t value);

// Adds one to `word` (any number of writers) and wakes its sleepers, if any:
// a doorbell that waiters watch with WaitForSeq(word, waiters, seen + 1, ...).
void BumpSeq(std::atomic<uint32_t>* word, std::atomic<uint32_t>* waiters);

// Wakes every sleeper on `word` unconditionally (used after setting an abort
// flag so sleepers re-run their checks promptly).
void WakeAll(std::atomic<uint32_t>* word);

}  // namespace tpudist::collectives::shm

#endif  // TPU_DIST_COLLECTIVES_SHM_WAIT_H_
