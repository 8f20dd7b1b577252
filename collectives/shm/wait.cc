#include "collectives/shm/wait.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <ctime>

namespace tpudist::collectives::shm {
namespace {

// Word-sized futex on a (possibly cross-process) atomic.
long Futex(const std::atomic<uint32_t>* word, int op, uint32_t val,
           const struct timespec* ts) {
  return syscall(SYS_futex, const_cast<std::atomic<uint32_t>*>(word), op, val,
                 ts, nullptr, 0);
}

}  // namespace

WaitPolicy ChooseWaitPolicy(int local_ranks, int usable_cores) {
  WaitPolicy p;
  p.spin_iters = local_ranks > usable_cores ? 0 : 32;
  p.yield_iters = 64;
  return p;
}

YieldGate NextYieldGate(const YieldGate& gate, int64_t now_ns, int64_t slowest_yield_ns,
                        const WaitPolicy& policy) {
  const int64_t min_ns = absl::ToInt64Nanoseconds(policy.yield_backoff_min);
  const int64_t max_ns = std::max(min_ns, absl::ToInt64Nanoseconds(policy.yield_backoff_max));
  YieldGate next = gate;
  const int to_close = std::max(1, policy.slow_stages_to_close);
  if (slowest_yield_ns >= absl::ToInt64Nanoseconds(policy.slow_yield)) {
    next.slow_streak = gate.slow_streak + 1;
    if (next.slow_streak >= to_close) {
      next.backoff_ns = std::clamp(gate.backoff_ns > max_ns / 2 ? max_ns : 2 * gate.backoff_ns,
                                   min_ns, max_ns);
      next.closed_until_ns = now_ns + next.backoff_ns;
      next.slow_streak = to_close - 1;
    }
  } else {
    next.slow_streak = 0;
    next.backoff_ns = gate.backoff_ns / 2 < min_ns ? 0 : gate.backoff_ns / 2;
  }
  return next;
}

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

absl::Status WaitForSeq(const std::atomic<uint32_t>* word,
                        std::atomic<uint32_t>* waiters, uint32_t target,
                        absl::Time deadline, const WaitPolicy& policy,
                        YieldGate* gate, absl::FunctionRef<absl::Status()> check) {
  for (int i = 0; i < policy.spin_iters; ++i) {
    if (SeqReached(word->load(std::memory_order_acquire), target)) {
      return absl::OkStatus();
    }
    _mm_pause();
  }
  if (!policy.adaptive_yield) gate = nullptr;
  if (policy.yield_iters > 0) {
    // Adaptive (gate != null): time every yield; stop at the first slow one
    // and let the gate decide when to try again.
    int64_t t = gate != nullptr ? SteadyNanos() : 0;
    if (gate == nullptr || YieldGateOpen(*gate, t)) {
      const int64_t slow_ns = absl::ToInt64Nanoseconds(policy.slow_yield);
      int64_t slowest = 0;
      int yields = 0;
      bool reached = false;
      while (true) {
        if (SeqReached(word->load(std::memory_order_acquire), target)) {
          reached = true;
          break;
        }
        if (yields == policy.yield_iters) break;
        sched_yield();
        ++yields;
        if (gate != nullptr) {
          const int64_t now = SteadyNanos();
          slowest = std::max(slowest, now - t);
          t = now;
          if (slowest >= slow_ns) break;  // a foreign slice: futex from here
        }
      }
      if (gate != nullptr && yields > 0) *gate = NextYieldGate(*gate, t, slowest, policy);
      if (reached) return absl::OkStatus();
    }
  }
  // A sleep that ended without the target (a slice ran out, a wake such as
  // Poison's) calls for a check; EAGAIN (the word moved, e.g. another
  // rank's arrival) or EINTR does not.
  bool slept = false;
  while (true) {
    const uint32_t seen = word->load(std::memory_order_acquire);
    if (SeqReached(seen, target)) return absl::OkStatus();
    if (slept) {
      // A failed check loses to a wait that completed meanwhile: the last
      // arrival may have come while this rank was preempted, and a peer that
      // left the completed phase may have exited since (its death says
      // nothing about a phase it already published).
      if (absl::Status s = check(); !s.ok()) {
        if (SeqReached(word->load(std::memory_order_acquire), target)) {
          return absl::OkStatus();
        }
        return s;
      }
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) return absl::DeadlineExceededError("deadline passed");
    const absl::Duration slice = std::min(policy.futex_slice, deadline - now);
    const struct timespec ts = absl::ToTimespec(slice);
    waiters->fetch_add(1, std::memory_order_seq_cst);
    // FUTEX_WAIT re-checks *word == seen atomically, so a publish between
    // our load and this call makes it return immediately (EAGAIN).
    if (SeqReached(word->load(std::memory_order_seq_cst), target)) {
      waiters->fetch_sub(1, std::memory_order_seq_cst);
      return absl::OkStatus();
    }
    const long rc = Futex(word, FUTEX_WAIT, seen, &ts);
    slept = rc == 0 || errno == ETIMEDOUT;
    waiters->fetch_sub(1, std::memory_order_seq_cst);
  }
}

void PublishSeq(std::atomic<uint32_t>* word, std::atomic<uint32_t>* waiters,
                uint32_t value) {
  word->store(value, std::memory_order_seq_cst);
  if (waiters->load(std::memory_order_seq_cst) != 0) {
    Futex(word, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

void BumpSeq(std::atomic<uint32_t>* word, std::atomic<uint32_t>* waiters) {
  word->fetch_add(1, std::memory_order_seq_cst);
  if (waiters->load(std::memory_order_seq_cst) != 0) {
    Futex(word, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

void WakeAll(std::atomic<uint32_t>* word) {
  Futex(word, FUTEX_WAKE, INT_MAX, nullptr);
}

}  // namespace tpudist::collectives::shm
