#include "collectives/shm/p2p.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "collectives/shm/wait.h"

namespace tpudist::collectives::shm {
WaitPolicy ShmP2p::Policy() const {
  WaitPolicy p = comm_->wait_policy();
  p.yield_iters = std::max(p.yield_iters, 512);
  return p;
}

YieldGate* ShmP2p::ThreadGate() {
  thread_local YieldGate gate;
  return &gate;
}

ShmP2p::ShmP2p(Communicator* comm)
    : comm_(comm),
      rank_(comm->rank()),
      size_(comm->size()),
      send_error_(comm->size()),
      inbound_(comm->size()),
      recv_draining_(new std::atomic<int>[comm->size()]()),
      in_(comm->size()) {
  for (int r = 0; r < size_; ++r) {
    send_mu_.push_back(std::make_unique<absl::Mutex>());
    drain_mu_.push_back(std::make_unique<absl::Mutex>());
  }
  reader_ = std::thread([this] { ReadLoop(); });
}

ShmP2p::~ShmP2p() {
  Abort(absl::CancelledError(absl::StrCat(Context(), ": shut down")));
  stop_.store(true, std::memory_order_release);
  WakeRecvs();
  reader_.join();
}

std::string ShmP2p::Context() const {
  return absl::StrCat("shm p2p rank ", comm_->Label(rank_));
}

void ShmP2p::WakeRecvs() {
  BumpSeq(comm_->p2p_doorbell(rank_), comm_->p2p_doorbell_waiters(rank_));
}

void ShmP2p::Abort(const absl::Status& cause) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_.ok()) aborted_ = cause.ok() ? absl::AbortedError("aborted") : cause;
  }
  aborted_flag_.store(true, std::memory_order_release);
  WakeRecvs();  // and the reader, which fails frames being filled
}

absl::Status ShmP2p::Send(int dst, int tag, absl::Span<const uint8_t> data,
                          absl::Time deadline) {
  if (dst < 0 || dst >= size_ || dst == rank_) {
    return absl::InvalidArgumentError(absl::StrCat(Context(), ": send to invalid local rank ", dst));
  }
  const absl::Time start = absl::Now();
  absl::MutexLock send_lock(send_mu_[dst].get());
  if (!send_error_[dst].ok()) return send_error_[dst];
  if (aborted_flag_.load(std::memory_order_acquire)) {
    absl::MutexLock lock(&mu_);
    return aborted_;
  }
  P2pRing ring = comm_->p2p_ring(rank_, dst);
  P2pRingControl* rc = ring.control();
  const FrameHeader header{kFrameMagic, tag, data.size()};
  const uint8_t* parts[2] = {reinterpret_cast<const uint8_t*>(&header), data.data()};
  const uint64_t sizes[2] = {sizeof(header), data.size()};
  const WaitPolicy policy = Policy();
  bool wrote = false;
  for (int part = 0; part < 2; ++part) {
    uint64_t done = 0;
    while (done < sizes[part]) {
      const uint32_t seen = rc->consumed.load(std::memory_order_acquire);
      const uint64_t n = ring.Write(parts[part] + done, sizes[part] - done);
      if (n > 0) {
        done += n;
        wrote = true;
        BumpSeq(comm_->p2p_doorbell(dst), comm_->p2p_doorbell_waiters(dst));
        continue;
      }
      // The ring is full: wait for the receiver's reader to consume.
      absl::Status s = WaitForSeq(&rc->consumed, &rc->consumed_waiters, seen + 1, deadline,
                                  policy, ThreadGate(), [&] {
                                    if (aborted_flag_.load(std::memory_order_acquire)) {
                                      absl::MutexLock lock(&mu_);
                                      return aborted_;
                                    }
                                    return comm_->PeerAlive(dst);
                                  });
      if (s.ok()) continue;
      const std::string what = absl::StrCat(
          Context(), ": send to peer rank ", comm_->Label(dst), " (tag ", tag, ", ", data.size(),
          " bytes) after ", absl::FormatDuration(absl::Now() - start), ", ",
          done + (part == 1 ? sizeof(header) : 0), " bytes of the frame written");
      s = absl::IsDeadlineExceeded(s)
              ? absl::DeadlineExceededError(absl::StrCat(
                    what, ": timed out with the receiver's ring full (is it alive and "
                          "draining?)"))
              : absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
      if (wrote) send_error_[dst] = s;  // a partial frame: the stream is broken
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ShmP2p::Recv(int src, int tag, absl::Span<uint8_t> data, absl::Time deadline) {
  if (src < 0 || src >= size_ || src == rank_) {
    return absl::InvalidArgumentError(absl::StrCat(Context(), ": recv from invalid local rank ", src));
  }
  const absl::Time start = absl::Now();
  const std::string what = absl::StrCat(Context(), ": recv from peer rank ", comm_->Label(src),
                                        " (tag ", tag, ", ", data.size(), " bytes)");
  Message m;
  Posted posted;
  posted.tag = tag;
  posted.data = data;
  posted.deadline = deadline;
  {
    absl::MutexLock lock(&mu_);
    InPeer& in = in_[src];
    if (in.posted == nullptr) in.posted = &posted;
    ++in.waiting;
    recv_draining_[src].fetch_add(1, std::memory_order_acq_rel);
    auto leave = [&] {
      --in.waiting;
      recv_draining_[src].fetch_sub(1, std::memory_order_acq_rel);
      if (in.posted == &posted) in.posted = nullptr;
    };
    while (true) {
      if (posted.state == Posted::kDone) {
        leave();
        if (!posted.status.ok()) {
          return absl::Status(posted.status.code(),
                              absl::StrCat(what, ": ", posted.status.message()));
        }
        return absl::OkStatus();
      }
      if (posted.state == Posted::kWaiting) {
        if (std::optional<absl::Status> r = in.Look(
                tag, aborted_, start, deadline, what, "(no message with this tag arrived)", &m)) {
          leave();
          if (!r->ok()) return *r;
          break;
        }
      }
      // While a Recv waits on src, it drains src's ring itself (the reader
      // thread leaves that ring alone): the message needs no hand-off between
      // threads. The doorbell is read under mu_, before the drain: whatever
      // arrives later, and every state change made under mu_ since (WakeRecvs),
      // rings it again and ends the sleep. A frame being filled that stalls
      // is failed by the reader's checks (by our deadline, an abort, the
      // peer's death).
      const uint32_t bell = comm_->p2p_doorbell(rank_)->load(std::memory_order_acquire);
      const bool filling = posted.state == Posted::kFilling;
      mu_.Unlock();
      if (!DrainLocked(src)) {
        const absl::Time slice = absl::Now() + absl::Nanoseconds(kCheckEveryNs);
        (void)WaitForSeq(comm_->p2p_doorbell(rank_), comm_->p2p_doorbell_waiters(rank_),
                         bell + 1, filling ? slice : std::min(deadline, slice),
                         Policy(), ThreadGate(), [] { return absl::OkStatus(); });
      }
      mu_.Lock();
    }
  }
  if (m.size != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(Context(), ": recv from peer rank ",
                                                   comm_->Label(src), " (tag ", tag, "): expected ",
                                                   data.size(), " bytes, the sender sent ", m.size));
  }
  if (m.size > 0) std::memcpy(data.data(), m.bytes.get(), m.size);
  return absl::OkStatus();
}

}  // namespace tpudist::collectives::shm
