// P2pRing: a single-producer, single-consumer byte ring in shared memory, the
// channel of one ordered pair of ranks for point-to-point messages inside a
// host (p2p.h). The producer owns `head` (bytes ever written), the consumer
// owns `tail` (bytes ever consumed); both are 64-bit and never wrap. Data
// written before a head store (release) is visible to a consumer that loads
// that head (acquire); space is reused only after the consumer's tail store
// (release) is seen. The consumer also bumps `consumed` (a futex word) after
// each read, so a producer waiting for space can sleep on it (wait.h).
//
// P2pRing itself is a view (pointers into a mapping it does not own).
// Thread-safety: one producer thread and one consumer thread at a time, in
// any processes mapping the ring.
#ifndef TPU_DIST_COLLECTIVES_SHM_P2P_RING_H_
#define TPU_DIST_COLLECTIVES_SHM_P2P_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tpudist::collectives::shm {

struct P2pRingControl {
  alignas(64) std::atomic<uint64_t> head;  // written by the producer
  alignas(64) std::atomic<uint64_t> tail;  // written by the consumer
  std::atomic<uint32_t> consumed;          // bumped by the consumer per read
  std::atomic<uint32_t> consumed_waiters;  // producers asleep on `consumed`
};
// Bytes a ring's control block takes in a segment (a multiple of 64).
inline constexpr size_t kP2pRingControlBytes = (sizeof(P2pRingControl) + 63) / 64 * 64;

class P2pRing {
 public:
  // `control` and `data` ([capacity] bytes) live in a zero-filled shared
  // mapping (an all-zero control is an empty ring). REQUIRES: capacity > 0.
  P2pRing(P2pRingControl* control, char* data, uint64_t capacity)
      : control_(control), data_(data), capacity_(capacity) {}

  uint64_t capacity() const { return capacity_; }
  P2pRingControl* control() const { return control_; }

  // Producer: bytes that fit now.
  uint64_t Free() const;
  // Producer: copies min(n, Free()) bytes of `src` in and publishes them;
  // returns how many.
  uint64_t Write(const void* src, uint64_t n);

  // Consumer: bytes published and not yet read.
  uint64_t Available() const;
  // Consumer: copies min(n, Available()) bytes out into `dst` (nullptr:
  // drops them), frees their space and wakes a producer waiting for it;
  // returns how many.
  uint64_t Read(void* dst, uint64_t n);

 private:
  P2pRingControl* control_;
  char* data_;
  uint64_t capacity_;
};

}  // namespace tpudist::collectives::shm

#endif  // TPU_DIST_COLLECTIVES_SHM_P2P_RING_H_
