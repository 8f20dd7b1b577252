#include "collectives/shm/p2p_ring.h"

#include <algorithm>
#include <cstring>

#include "collectives/shm/wait.h"

namespace tpudist::collectives::shm {

uint64_t P2pRing::Free() const {
  const uint64_t head = control_->head.load(std::memory_order_relaxed);  // ours
  return capacity_ - (head - control_->tail.load(std::memory_order_acquire));
}

uint64_t P2pRing::Write(const void* src, uint64_t n) {
  const uint64_t head = control_->head.load(std::memory_order_relaxed);
  const uint64_t take = std::min(n, Free());
  if (take == 0) return 0;
  const uint64_t at = head % capacity_;
  const uint64_t first = std::min(take, capacity_ - at);
  std::memcpy(data_ + at, src, first);
  if (take > first) std::memcpy(data_, static_cast<const char*>(src) + first, take - first);
  control_->head.store(head + take, std::memory_order_release);
  return take;
}

uint64_t P2pRing::Available() const {
  const uint64_t tail = control_->tail.load(std::memory_order_relaxed);  // ours
  return control_->head.load(std::memory_order_acquire) - tail;
}

uint64_t P2pRing::Read(void* dst, uint64_t n) {
  const uint64_t tail = control_->tail.load(std::memory_order_relaxed);
  const uint64_t take = std::min(n, Available());
  if (take == 0) return 0;
  if (dst != nullptr) {
    const uint64_t at = tail % capacity_;
    const uint64_t first = std::min(take, capacity_ - at);
    std::memcpy(dst, data_ + at, first);
    if (take > first) std::memcpy(static_cast<char*>(dst) + first, data_, take - first);
  }
  control_->tail.store(tail + take, std::memory_order_release);
  BumpSeq(&control_->consumed, &control_->consumed_waiters);
  return take;
}

}  // namespace tpudist::collectives::shm
