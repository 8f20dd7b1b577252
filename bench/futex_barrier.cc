#include "bench/futex_barrier.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tpudist::bench {
namespace {

long Futex(std::atomic<uint32_t>* word, int op, uint32_t val, const struct timespec* ts) {
  return syscall(SYS_futex, word, op, val, ts, nullptr, 0);
}

}  // namespace

absl::StatusOr<FutexBarrier> FutexBarrier::Create(int world) {
  void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("futex barrier: mmap: ", std::strerror(errno)));
  }
  Shared* s = new (p) Shared;
  s->arrivals.store(0);
  s->sleepers.store(0);
  return FutexBarrier(s, world);
}

FutexBarrier::FutexBarrier(FutexBarrier&& other) noexcept
    : shared_(other.shared_), world_(other.world_), round_(other.round_) {
  other.shared_ = nullptr;
}

FutexBarrier::~FutexBarrier() {
  if (shared_ != nullptr) munmap(shared_, sizeof(Shared));
}

bool FutexBarrier::Wait(int spin_iters, int yield_iters, absl::Duration timeout) {
  const uint32_t target = ++round_ * static_cast<uint32_t>(world_);
  auto reached = [&](uint32_t v) { return static_cast<int32_t>(v - target) >= 0; };
  if (shared_->arrivals.fetch_add(1, std::memory_order_seq_cst) + 1 == target) {
    if (shared_->sleepers.load(std::memory_order_seq_cst) != 0) {
      Futex(&shared_->arrivals, FUTEX_WAKE, INT_MAX, nullptr);
    }
    return true;
  }
  for (int i = 0; i < spin_iters; ++i) {
    if (reached(shared_->arrivals.load(std::memory_order_acquire))) return true;
    _mm_pause();
  }
  for (int i = 0; i < yield_iters; ++i) {
    if (reached(shared_->arrivals.load(std::memory_order_acquire))) return true;
    sched_yield();
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const uint32_t seen = shared_->arrivals.load(std::memory_order_acquire);
    if (reached(seen)) return true;
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    const struct timespec ts = absl::ToTimespec(deadline - now);
    shared_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (!reached(shared_->arrivals.load(std::memory_order_seq_cst))) {
      Futex(&shared_->arrivals, FUTEX_WAIT, seen, &ts);
    }
    shared_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

double FutexBarrier::TimeRounds(int rounds, int spin_iters, int yield_iters) {
  const absl::Duration timeout = absl::Seconds(60);
  if (!Wait(spin_iters, yield_iters, timeout)) return -1;  // warm-up
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i) {
    if (!Wait(spin_iters, yield_iters, timeout)) return -1;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return secs / std::max(rounds, 1);
}

}  // namespace tpudist::bench
