// ShmP2p: point-to-point messages (send/recv with a tag) between the ranks
// of one host through shared memory: the Communicator's ring per ordered
// pair (p2p_ring.h) instead of a loopback TCP connection. Same contract as
// tcp::TcpP2p, which the process group keeps for ranks on other hosts:
//
//   * Send returns once the whole message is in the ring (it waits for space
//     while the receiver drains) and never waits for the matching Recv:
//     each rank runs a reader thread that drains its incoming rings into
//     per-(peer, tag) queues, so two ranks that both send before they
//     receive do not deadlock at any size. Messages of one pair arrive in
//     order; a Recv takes the oldest queued message of (peer, tag).
//   * A Recv already waiting when its message starts (nothing of that tag
//     queued, same size) gets it copied straight from the ring into its
//     buffer: two copies in all (sender -> ring -> receiver), no syscalls
//     but futex wake-ups of sleepers. A waiting Recv drains its peer's ring
//     itself (the reader thread leaves that ring alone meanwhile), so a
//     message it waits for needs no hand-off between threads.
//   * A Recv of the wrong size fails InvalidArgument (the message is
//     consumed). A peer that dies fails Recvs that wait on it, once what it
//     had sent is consumed, and Sends blocked on its full ring (Unavailable
//     naming it); deadlines bound every wait; Abort() fails everything
//     within a futex slice. A Send that fails after writing part of a
//     message leaves that pair's stream broken: later Sends to that peer
//     fail with the same status.
//
// Wire format in a ring: a 16-byte frame header {magic, tag, byte count},
// then the payload, both streamed through as space frees up.
//
// Ranks are the Communicator's local ranks; messages name them by their
// labels (group ranks). Ownership: `comm` is not owned and must outlive this
// object. Thread-safety: Send, Recv and Abort are thread-safe; Sends to one
// peer are serialised.
#ifndef TPU_DIST_COLLECTIVES_SHM_P2P_H_
#define TPU_DIST_COLLECTIVES_SHM_P2P_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "collectives/core/p2p_inbox.h"
#include "collectives/shm/communicator.h"
#include "collectives/shm/wait.h"

namespace tpudist::collectives::shm {

class ShmP2p {
 public:
  // Starts the reader thread. REQUIRES: comm->p2p_ring_bytes() > 0.
  explicit ShmP2p(Communicator* comm);
  // Fails pending calls (Cancelled) and joins the reader.
  ~ShmP2p();
  ShmP2p(const ShmP2p&) = delete;
  ShmP2p& operator=(const ShmP2p&) = delete;

  // Sends `data` to local rank `dst` under `tag`. REQUIRES: dst != rank().
  absl::Status Send(int dst, int tag, absl::Span<const uint8_t> data, absl::Time deadline);
  // Receives the next message from local rank `src` under `tag` into `data`,
  // which must be its exact size.
  absl::Status Recv(int src, int tag, absl::Span<uint8_t> data, absl::Time deadline);
  // Fails in-flight and later Send/Recv with `cause`. Idempotent.
  void Abort(const absl::Status& cause);

 private:
  static constexpr uint32_t kFrameMagic = 0x31703270;  // "p2p1"
  // How often the reader looks at stalled frames and dead peers, and how
  // long a Recv being filled waits between looks at its state.
  static constexpr int64_t kCheckEveryNs = 50'000'000;

  using Message = P2pMessage;
  using Posted = P2pPosted;  // a Recv waiting with nothing of its tag queued
  struct InPeer : P2pInbox {  // closed: the peer died / its stream broke
    int waiting = 0;          // Recvs waiting on this peer
  };
  struct FrameHeader {
    uint32_t magic;
    int32_t tag;
    uint64_t bytes;
  };
  // The reader thread's state of one incoming ring (touched only by it).
  struct Inbound {
    bool in_frame = false;
    FrameHeader header{};
    uint64_t done = 0;
    uint8_t* dst = nullptr;  // posted buffer or message bytes
    Posted* posted = nullptr;
    Message message;
    bool dropping = false;  // the rest of this frame goes nowhere
    bool broken = false;    // corrupt stream: drop everything from now on
  };

  // Every wait here: the group's spin stage, up to 512 yields, then the
  // futex. The yields matter: a futex sleep on an idle virtual CPU halts it,
  // and waking it costs tens of microseconds (1 MiB in-process ping-pong
  // 751 -> 163 us one-way with 64 yields; p2p_bench 8 B 25-76 -> 3.7 us, 16
  // MiB 4.8-5.1 -> 2.8-2.9 ms with 512). Adaptive, as the collectives'
  // (wait.h): yields that hand whole time slices to a foreign busy process
  // close the calling thread's gate (ThreadGate) and leave the futex alone.
  WaitPolicy Policy() const;
  static YieldGate* ThreadGate();  // this thread's, for every ShmP2p
  // The reader thread (p2p_reader.cc).
  void ReadLoop();
  // Moves whatever ring src -> this rank holds along; true if it read bytes.
  // REQUIRES: drain_mu_[src] held.
  bool Drain(int src) ABSL_LOCKS_EXCLUDED(mu_);
  // Drain(src) under drain_mu_[src].
  bool DrainLocked(int src) ABSL_LOCKS_EXCLUDED(mu_);
  // Under mu_: where the frame just started goes (a posted Recv or a queue).
  void StartFrame(int src, Inbound& in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The frame of `in` is complete: delivers it (unless dropping).
  void EndFrame(int src, Inbound& in) ABSL_LOCKS_EXCLUDED(mu_);
  // Fails the Recv being filled from `in` with `status`; the rest of the
  // frame is dropped as it arrives.
  void AbandonFrame(int src, Inbound& in, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // When idle: fails a frame whose Recv's deadline passed or that Abort
  // ended, and closes peers that died with nothing left in their ring.
  void CheckStalled() ABSL_LOCKS_EXCLUDED(mu_);
  std::string Context() const;
  // Bumps this rank's doorbell: wakes Recvs (and the reader) asleep on it.
  void WakeRecvs();

  Communicator* const comm_;
  const int rank_;
  const int size_;
  std::vector<std::unique_ptr<absl::Mutex>> send_mu_;  // [size]
  // [size], send_error_[d] guarded by send_mu_[d] (per element: not
  // expressible as an annotation, nor is drain_mu_[src] below).
  std::vector<absl::Status> send_error_;
  // inbound_[src] is drained by whoever holds drain_mu_[src]: the reader
  // thread, or a Recv from src. Order: drain_mu_[src] before mu_.
  std::vector<std::unique_ptr<absl::Mutex>> drain_mu_;  // [size]
  std::vector<Inbound> inbound_;                         // [size]
  // Recvs from src now waiting (and draining src's ring themselves); the
  // reader thread leaves src's ring to them.
  std::unique_ptr<std::atomic<int>[]> recv_draining_;  // [size]
  std::atomic<bool> stop_{false};
  std::atomic<bool> aborted_flag_{false};

  // Guards in_ and aborted_. Recvs wait on this rank's doorbell (they drain
  // their ring themselves), so every change a Recv waits for -- a message
  // queued or a frame ended while it waits, a peer closed, abort -- is made
  // under mu_ and followed by WakeRecvs().
  absl::Mutex mu_;
  std::vector<InPeer> in_ ABSL_GUARDED_BY(mu_);  // [size]
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  std::thread reader_;
};

}  // namespace tpudist::collectives::shm

#endif  // TPU_DIST_COLLECTIVES_SHM_P2P_H_
