// ShmP2p's reader thread (the rest of the class is in p2p.cc): it sleeps on
// this rank's doorbell, drains every incoming ring into posted Recvs or the
// per-(peer, tag) queues, and every kCheckEvery fails what cannot finish: a
// frame being read into a Recv whose deadline passed or that Abort ended,
// and peers that died with nothing left in their ring.
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "collectives/shm/p2p.h"
#include "collectives/shm/wait.h"

namespace tpudist::collectives::shm {
void ShmP2p::ReadLoop() {
  std::atomic<uint32_t>* bell = comm_->p2p_doorbell(rank_);
  std::atomic<uint32_t>* bell_waiters = comm_->p2p_doorbell_waiters(rank_);
  // The group's own policy (64 yields): the reader is on no one's critical
  // path when a Recv waits (that Recv drains its ring itself).
  const WaitPolicy policy = comm_->wait_policy();
  int64_t last_check = SteadyNanos();
  while (!stop_.load(std::memory_order_acquire)) {
    const uint32_t seen = bell->load(std::memory_order_acquire);
    bool progress = false;
    for (int src = 0; src < size_; ++src) {
      if (src == rank_ || recv_draining_[src].load(std::memory_order_acquire) > 0) continue;
      progress = DrainLocked(src) || progress;
    }
    const int64_t now = SteadyNanos();
    if (now - last_check >= kCheckEveryNs || aborted_flag_.load(std::memory_order_acquire)) {
      CheckStalled();
      last_check = now;
    }
    if (progress) continue;
    // Sleep until a sender rings (or the next check is due).
    (void)WaitForSeq(bell, bell_waiters, seen + 1,
                     absl::Now() + absl::Nanoseconds(kCheckEveryNs), policy, ThreadGate(),
                     [] { return absl::OkStatus(); });
  }
}

bool ShmP2p::DrainLocked(int src) {
  absl::MutexLock lock(drain_mu_[src].get());
  return Drain(src);
}

bool ShmP2p::Drain(int src) {
  P2pRing ring = comm_->p2p_ring(src, rank_);
  Inbound& in = inbound_[src];
  bool progress = false;
  while (true) {
    if (in.broken) return ring.Read(nullptr, std::numeric_limits<uint64_t>::max()) > 0 || progress;
    if (!in.in_frame) {
      if (ring.Available() < sizeof(FrameHeader)) return progress;
      ring.Read(&in.header, sizeof(FrameHeader));
      progress = true;
      absl::MutexLock lock(&mu_);
      if (in.header.magic != kFrameMagic) {
        in.broken = true;
        in_[src].closed = absl::InternalError(absl::StrCat(
            "the stream from peer rank ", comm_->Label(src), " is corrupt (frame magic ",
            in.header.magic, ")"));
        WakeRecvs();
        continue;
      }
      in.in_frame = true;
      in.done = 0;
      StartFrame(src, in);
    }
    if (in.done < in.header.bytes) {
      const uint64_t n =
          ring.Read(in.dropping ? nullptr : in.dst + in.done, in.header.bytes - in.done);
      if (n == 0) return progress;
      in.done += n;
      progress = true;
    }
    if (in.done == in.header.bytes) EndFrame(src, in);
  }
}

void ShmP2p::StartFrame(int src, Inbound& in) {
  in.dropping = false;
  if (Posted* p = in_[src].ClaimPosted(in.header.tag, in.header.bytes)) {
    in.posted = p;
    in.dst = p->data.data();
    return;
  }
  in.posted = nullptr;
  in.message.size = in.header.bytes;
  in.message.bytes.reset(in.header.bytes > 0 ? new uint8_t[in.header.bytes] : nullptr);
  in.dst = in.message.bytes.get();
}

void ShmP2p::EndFrame(int src, Inbound& in) {
  absl::MutexLock lock(&mu_);
  if (in.posted != nullptr) {
    in.posted->status = absl::OkStatus();
    in.posted->state = Posted::kDone;
  } else if (!in.dropping) {
    in_[src].queues[in.header.tag].push_back(std::move(in.message));
  }
  in.in_frame = false;
  in.posted = nullptr;
  in.dst = nullptr;
  in.dropping = false;
  in.message = Message();
  if (in_[src].waiting > 0) WakeRecvs();
}

void ShmP2p::AbandonFrame(int src, Inbound& in, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (in.posted != nullptr) {
    in.posted->status = status;
    in.posted->state = Posted::kDone;
  }
  in.posted = nullptr;
  in.dst = nullptr;
  in.dropping = true;
  in.message = Message();
  WakeRecvs();
}

void ShmP2p::CheckStalled() {
  const absl::Time now = absl::Now();
  for (int src = 0; src < size_; ++src) {
    if (src == rank_) continue;
    absl::MutexLock drain_lock(drain_mu_[src].get());
    Inbound& in = inbound_[src];
    const bool ring_empty = comm_->p2p_ring(src, rank_).Available() == 0;
    bool watched = false;
    absl::Status aborted;
    {
      absl::MutexLock lock(&mu_);
      watched = in_[src].waiting > 0 && in_[src].closed.ok();
      aborted = aborted_;
    }
    // A Recv being filled from a frame that stopped: its deadline, an abort.
    if (in.in_frame && in.posted != nullptr) {
      absl::Status why = aborted;
      if (why.ok() && now >= in.posted->deadline) {
        why = absl::DeadlineExceededError(absl::StrCat(
            "timed out with ", in.done, " of ", in.header.bytes, " bytes arrived"));
      }
      if (!why.ok()) AbandonFrame(src, in, why);
    }
    // A peer that died: fail what waits on it once its ring is drained.
    if ((watched || in.in_frame) && ring_empty) {
      absl::Status alive = comm_->PeerAlive(src);
      if (alive.ok()) continue;
      if (in.in_frame) {
        AbandonFrame(src, in, absl::UnavailableError(absl::StrCat(
                                  alive.message(), " with ", in.done, " of ",
                                  in.header.bytes, " bytes of its message sent")));
        in.in_frame = false;
        in.dropping = false;
      }
      absl::MutexLock lock(&mu_);
      in_[src].closed = alive;
      WakeRecvs();
    }
  }
}

}  // namespace tpudist::collectives::shm
