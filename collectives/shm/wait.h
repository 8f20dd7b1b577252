// Waiting on a 32-bit sequence word in shared memory without starving peers.
//
// With 16 ranks on 2 cores a pure spin-wait steals the CPU from the very peer
// we are waiting for, so WaitForSeq backs off in three stages:
//   1. a bounded spin (policy.spin_iters iterations with _mm_pause),
//   2. a bounded run of sched_yield calls (policy.yield_iters),
//   3. FUTEX_WAIT on the shared word (non-private: the word lives in a
//      MAP_SHARED mapping seen by other processes), in slices of at most
//      policy.futex_slice so that `check` (peer liveness, abort flags) and the
//      deadline are looked at regularly.
// Writers publish with PublishSeq, which issues FUTEX_WAKE only when the
// word's sleeper count is non-zero, so the fast path costs no syscall.
//
// Sequence numbers wrap: "reached" means (int32_t)(value - target) >= 0.
//
// Thread-safety: all functions are safe to call concurrently from any thread
// or process mapping the same words.
#ifndef TPU_DIST_COLLECTIVES_SHM_WAIT_H_
#define TPU_DIST_COLLECTIVES_SHM_WAIT_H_

#include <atomic>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tpudist::collectives::shm {

// Defaults measured with collectives_bench on the shared 2-core box: short
// spins win (8 B allreduce, 2 ranks: ~3.5 us at 16-32 spins vs ~10 us at
// 256 and ~57 us at 2048; 16 ranks: 120 us vs 176 us at 256), because
// yielding hands the core to the peer being waited for.
struct WaitPolicy {
  int spin_iters = 32;
  int yield_iters = 64;
  absl::Duration futex_slice = absl::Milliseconds(5);
};

// True when `value` is at or past `target` in wrapping sequence order.
inline bool SeqReached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

// Blocks until SeqReached(word, target). `waiters` counts sleepers on `word`
// (shared with the writer). `check` is called in the slow path (after the
// spin and yield stages, then once per futex slice); a non-OK result ends
// the wait with that status. Returns DeadlineExceeded (bare message; callers
// add op / rank / peer context) when `deadline` passes first.
absl::Status WaitForSeq(const std::atomic<uint32_t>* word,
                        std::atomic<uint32_t>* waiters, uint32_t target,
                        absl::Time deadline, const WaitPolicy& policy,
                        absl::FunctionRef<absl::Status()> check);

// Stores `value` into `word` (release + full fence) and wakes sleepers.
void PublishSeq(std::atomic<uint32_t>* word, std::atomic<uint32_t>* waiters,
                uint32_t value);

// Wakes every sleeper on `word` unconditionally (used after setting an abort
// flag so sleepers re-run their checks promptly).
void WakeAll(std::atomic<uint32_t>* word);

}  // namespace tpudist::collectives::shm

#endif  // TPU_DIST_COLLECTIVES_SHM_WAIT_H_
