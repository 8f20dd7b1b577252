// TcpMesh data path: framed, poll()-driven, full-duplex transfers.
// Rendezvous and handshake live in tcp_mesh_connect.cc.

#include "collectives/tcp/tcp_mesh.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tpudist::collectives::tcp {
namespace {

constexpr uint32_t kFrameMagic = 0x52464454;  // "TDFR" in little-endian memory.

struct FrameHeader {
  uint32_t magic;
  uint32_t seq;
  uint64_t nbytes;
};
static_assert(sizeof(FrameHeader) == 16);

// Outcome of one non-blocking syscall attempt.
enum class Io { kProgress, kWouldBlock, kEof, kError };

}  // namespace

// One outgoing frame in flight.
struct TcpMesh::OutFrame {
  int peer = -1;
  FrameHeader header{};
  size_t header_done = 0;
  absl::Span<const uint8_t> payload;
  size_t payload_done = 0;
  int err = 0;

  bool done() const { return header_done == sizeof(header) && payload_done == payload.size(); }

  Io Step(int fd) {
    iovec iov[2];
    int n_iov = 0;
    if (header_done < sizeof(header)) {
      iov[n_iov++] = {reinterpret_cast<uint8_t*>(&header) + header_done,
                      sizeof(header) - header_done};
    }
    if (payload_done < payload.size()) {
      iov[n_iov++] = {const_cast<uint8_t*>(payload.data()) + payload_done,
                      payload.size() - payload_done};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n_iov;
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Io::kWouldBlock;
      err = errno;
      return Io::kError;
    }
    size_t left = static_cast<size_t>(n);
    size_t h = std::min(left, sizeof(header) - header_done);
    header_done += h;
    payload_done += left - h;
    return Io::kProgress;
  }
};

// One incoming frame in flight.
struct TcpMesh::InFrame {
  int peer = -1;
  FrameHeader header{};
  size_t header_done = 0;
  absl::Span<uint8_t> payload;
  size_t payload_done = 0;
  int err = 0;

  bool done() const { return header_done == sizeof(header) && payload_done == payload.size(); }

  // Reads into the header, then straight into the caller's buffer. Never
  // reads past the expected frame if the peer sent what we expect; if it sent
  // a different size the header check fails and the stream is abandoned.
  Io Step(int fd) {
    iovec iov[2];
    int n_iov = 0;
    if (header_done < sizeof(header)) {
      iov[n_iov++] = {reinterpret_cast<uint8_t*>(&header) + header_done,
                      sizeof(header) - header_done};
    }
    if (payload_done < payload.size()) {
      iov[n_iov++] = {payload.data() + payload_done, payload.size() - payload_done};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n_iov;
    ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT);
    if (n == 0) return Io::kEof;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Io::kWouldBlock;
      err = errno;
      return Io::kError;
    }
    size_t left = static_cast<size_t>(n);
    size_t h = std::min(left, sizeof(header) - header_done);
    header_done += h;
    payload_done += left - h;
    return Io::kProgress;
  }
};

absl::Status TcpMesh::CheckOp(absl::string_view op, int peer) const {
  if (absl::Status poison = poison_status(); !poison.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "TcpMesh rank ", rank_, ": ", op, " on a poisoned mesh; first error: ", poison.ToString()));
  }
  if (peer < 0 || peer >= size_ || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TcpMesh rank ", rank_, ": ", op, " with invalid peer ", peer, " (size ", size_, ")"));
  }
  return absl::OkStatus();
}

absl::Status TcpMesh::Send(int peer, absl::Span<const uint8_t> data, absl::Time deadline) {
  if (absl::Status s = CheckOp("Send", peer); !s.ok()) return s;
  OutFrame out;
  out.peer = peer;
  out.payload = data;
  return Transfer("Send", &out, nullptr, deadline);
}

absl::Status TcpMesh::Recv(int peer, absl::Span<uint8_t> data, absl::Time deadline) {
  if (absl::Status s = CheckOp("Recv", peer); !s.ok()) return s;
  InFrame in;
  in.peer = peer;
  in.payload = data;
  return Transfer("Recv", nullptr, &in, deadline);
}

absl::Status TcpMesh::SendRecv(int send_peer, absl::Span<const uint8_t> send, int recv_peer,
                               absl::Span<uint8_t> recv, absl::Time deadline) {
  if (absl::Status s = CheckOp("SendRecv", send_peer); !s.ok()) return s;
  if (absl::Status s = CheckOp("SendRecv", recv_peer); !s.ok()) return s;
  OutFrame out;
  out.peer = send_peer;
  out.payload = send;
  InFrame in;
  in.peer = recv_peer;
  in.payload = recv;
  return Transfer("SendRecv", &out, &in, deadline);
}

absl::Status TcpMesh::SendRecvOverlapped(int send_peer, absl::Span<const uint8_t> send,
                                         int recv_peer, absl::Span<uint8_t> recv,
                                         absl::FunctionRef<void()> overlap, absl::Time deadline) {
  absl::Status s = CheckOp("SendRecv", send_peer);
  if (s.ok()) s = CheckOp("SendRecv", recv_peer);
  if (!s.ok()) {
    overlap();
    return s;
  }
  OutFrame out;
  out.peer = send_peer;
  out.payload = send;
  InFrame in;
  in.peer = recv_peer;
  in.payload = recv;
  absl::FunctionRef<void()>* pending = &overlap;
  s = Transfer("SendRecv", &out, &in, deadline, &pending);
  if (pending != nullptr) overlap();  // The transfer failed before running it.
  return s;
}

absl::Status TcpMesh::Exchange(absl::Span<const SendBlock> sends,
                               absl::Span<const RecvBlock> recvs, absl::Time deadline) {
  constexpr absl::string_view kOp = "Exchange";
  const absl::Time start = absl::Now();
  std::vector<OutFrame> outs(sends.size());
  std::vector<InFrame> ins(recvs.size());
  std::vector<bool> seen_out(size_, false), seen_in(size_, false);
  for (size_t i = 0; i < sends.size(); ++i) {
    if (absl::Status s = CheckOp(kOp, sends[i].peer); !s.ok()) return s;
    if (seen_out[sends[i].peer]) {
      return absl::InvalidArgumentError(absl::StrCat("TcpMesh rank ", rank_,
                                                     ": Exchange sends twice to ", sends[i].peer));
    }
    seen_out[sends[i].peer] = true;
    outs[i].peer = sends[i].peer;
    outs[i].payload = sends[i].data;
    outs[i].header = FrameHeader{kFrameMagic, peers_[outs[i].peer].send_seq, sends[i].data.size()};
  }
  for (size_t i = 0; i < recvs.size(); ++i) {
    if (absl::Status s = CheckOp(kOp, recvs[i].peer); !s.ok()) return s;
    if (seen_in[recvs[i].peer]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TcpMesh rank ", rank_, ": Exchange receives twice from ", recvs[i].peer));
    }
    seen_in[recvs[i].peer] = true;
    ins[i].peer = recvs[i].peer;
    ins[i].payload = recvs[i].data;
  }
  std::vector<bool> header_checked(ins.size(), false);
  std::vector<pollfd> fds;
  while (true) {
    // Push and pull on every socket until all would block.
    bool progress = true;
    while (progress) {
      progress = false;
      for (OutFrame& out : outs) {
        if (out.done()) continue;
        const Io io = out.Step(peers_[out.peer].fd.get());
        if (io == Io::kProgress) progress = true;
        if (io == Io::kEof || io == Io::kError) {
          const bool gone = IsPeerGoneErrno(out.err);
          return Fail(gone ? absl::StatusCode::kUnavailable : absl::StatusCode::kInternal, kOp,
                      absl::StrCat(gone ? "peer rank " : "sending to peer rank ", out.peer,
                                   gone ? " is gone (send: " : " failed (",
                                   ErrnoString(out.err), ")"),
                      &out, nullptr, start, deadline);
        }
      }
      for (size_t i = 0; i < ins.size(); ++i) {
        InFrame& in = ins[i];
        if (in.done()) continue;
        const Io io = in.Step(peers_[in.peer].fd.get());
        if (io == Io::kProgress) progress = true;
        if (io == Io::kEof) {
          return Fail(absl::StatusCode::kUnavailable, kOp,
                      absl::StrCat("peer rank ", in.peer,
                                   " closed the connection (EOF; process exited or aborted)"),
                      nullptr, &in, start, deadline);
        }
        if (io == Io::kError) {
          const bool gone = IsPeerGoneErrno(in.err);
          return Fail(gone ? absl::StatusCode::kUnavailable : absl::StatusCode::kInternal, kOp,
                      absl::StrCat(gone ? "peer rank " : "receiving from peer rank ", in.peer,
                                   gone ? " is gone (recv: " : " failed (",
                                   ErrnoString(in.err), ")"),
                      nullptr, &in, start, deadline);
        }
        if (!header_checked[i] && in.header_done == sizeof(FrameHeader)) {
          header_checked[i] = true;
          const FrameHeader& h = in.header;
          const uint32_t want_seq = peers_[in.peer].recv_seq;
          if (h.magic != kFrameMagic || h.seq != want_seq || h.nbytes != in.payload.size()) {
            return Fail(absl::StatusCode::kInvalidArgument, kOp,
                        absl::StrCat("frame from peer rank ", in.peer, " has magic 0x",
                                     absl::Hex(h.magic), ", seq ", h.seq, ", ", h.nbytes,
                                     " bytes; expected seq ", want_seq, " and ",
                                     in.payload.size(),
                                     " bytes (ranks disagree on the collective's sizes?)"),
                        nullptr, &in, start, deadline);
          }
        }
      }
    }
    // Wait for any socket that still has work (one entry per fd).
    fds.clear();
    auto want = [&fds](int fd, short events) {
      for (pollfd& p : fds) {
        if (p.fd == fd) {
          p.events |= events;
          return;
        }
      }
      fds.push_back({fd, events, 0});
    };
    for (const OutFrame& out : outs) {
      if (!out.done()) want(peers_[out.peer].fd.get(), POLLOUT);
    }
    for (const InFrame& in : ins) {
      if (!in.done()) want(peers_[in.peer].fd.get(), POLLIN);
    }
    if (fds.empty()) break;
    if (absl::Now() >= deadline) {
      const OutFrame* out = nullptr;
      for (const OutFrame& o : outs) out = (out == nullptr && !o.done()) ? &o : out;
      const InFrame* in = nullptr;
      for (const InFrame& f : ins) in = (in == nullptr && !f.done()) ? &f : in;
      return Fail(absl::StatusCode::kDeadlineExceeded, kOp, "deadline exceeded", out, in, start,
                  deadline);
    }
    const int rc = poll(fds.data(), fds.size(), PollTimeoutMs(deadline));
    if (rc < 0 && errno != EINTR) {
      return Fail(absl::StatusCode::kInternal, kOp, absl::StrCat("poll: ", ErrnoString(errno)),
                  nullptr, nullptr, start, deadline);
    }
    // Timeouts and POLLERR/POLLHUP are reported by the next pass.
  }
  for (const OutFrame& out : outs) ++peers_[out.peer].send_seq;
  for (const InFrame& in : ins) ++peers_[in.peer].recv_seq;
  return absl::OkStatus();
}

absl::Status TcpMesh::Transfer(absl::string_view op, OutFrame* out, InFrame* in,
                               absl::Time deadline, absl::FunctionRef<void()>** overlap) {
  const absl::Time start = absl::Now();
  if (out != nullptr) {
    out->header = FrameHeader{kFrameMagic, peers_[out->peer].send_seq, out->payload.size()};
  }
  bool header_checked = false;
  const int out_fd = out ? peers_[out->peer].fd.get() : -1;
  const int in_fd = in ? peers_[in->peer].fd.get() : -1;
  while (true) {
    // Optimistically push and pull until both sides would block.
    bool progress = true;
    while (progress) {
      progress = false;
      if (out != nullptr && !out->done()) {
        switch (out->Step(out_fd)) {
          case Io::kProgress:
            progress = true;
            break;
          case Io::kWouldBlock:
            break;
          case Io::kEof:
          case Io::kError: {
            const bool gone = IsPeerGoneErrno(out->err);
            return Fail(
                gone ? absl::StatusCode::kUnavailable : absl::StatusCode::kInternal, op,
                absl::StrCat(gone ? "peer rank " : "sending to peer rank ", out->peer,
                             gone ? " is gone (send: " : " failed (", ErrnoString(out->err), ")"),
                out, in, start, deadline);
          }
        }
      }
      if (in != nullptr && !in->done()) {
        switch (in->Step(in_fd)) {
          case Io::kProgress:
            progress = true;
            break;
          case Io::kWouldBlock:
            break;
          case Io::kEof:
            return Fail(absl::StatusCode::kUnavailable, op,
                        absl::StrCat("peer rank ", in->peer,
                                     " closed the connection (EOF; process exited or aborted)"),
                        out, in, start, deadline);
          case Io::kError: {
            const bool gone = IsPeerGoneErrno(in->err);
            return Fail(
                gone ? absl::StatusCode::kUnavailable : absl::StatusCode::kInternal, op,
                absl::StrCat(gone ? "peer rank " : "receiving from peer rank ", in->peer,
                             gone ? " is gone (recv: " : " failed (", ErrnoString(in->err), ")"),
                out, in, start, deadline);
          }
        }
        if (!header_checked && in->header_done == sizeof(FrameHeader)) {
          header_checked = true;
          const FrameHeader& h = in->header;
          const uint32_t want_seq = peers_[in->peer].recv_seq;
          if (h.magic != kFrameMagic || h.seq != want_seq || h.nbytes != in->payload.size()) {
            return Fail(absl::StatusCode::kInvalidArgument, op,
                        absl::StrCat("frame from peer rank ", in->peer, " has magic 0x",
                                     absl::Hex(h.magic), ", seq ", h.seq, ", ", h.nbytes,
                                     " bytes; expected seq ", want_seq, " and ", in->payload.size(),
                                     " bytes (ranks disagree on the collective's sizes?)"),
                        out, in, start, deadline);
          }
        }
      }
    }
    if (overlap != nullptr && *overlap != nullptr) {
      (**overlap)();
      *overlap = nullptr;
      continue;  // The kernel moved bytes meanwhile: push and pull again.
    }
    const bool out_done = out == nullptr || out->done();
    const bool in_done = in == nullptr || in->done();
    if (out_done && in_done) break;
    if (absl::Now() >= deadline) {
      return Fail(absl::StatusCode::kDeadlineExceeded, op, "deadline exceeded", out, in, start,
                  deadline);
    }

    pollfd fds[2];
    int n_fds = 0;
    if (!out_done) fds[n_fds++] = {out_fd, POLLOUT, 0};
    if (!in_done) {
      if (n_fds == 1 && fds[0].fd == in_fd) {
        fds[0].events |= POLLIN;
      } else {
        fds[n_fds++] = {in_fd, POLLIN, 0};
      }
    }
    int rc = poll(fds, n_fds, PollTimeoutMs(deadline));
    if (rc < 0 && errno != EINTR) {
      return Fail(absl::StatusCode::kInternal, op, absl::StrCat("poll: ", ErrnoString(errno)), out,
                  in, start, deadline);
    }
    if (rc == 0 && absl::Now() >= deadline) {
      return Fail(absl::StatusCode::kDeadlineExceeded, op, "deadline exceeded", out, in, start,
                  deadline);
    }
    // POLLERR/POLLHUP fall through to the next Step, which reports errno/EOF.
  }
  if (out != nullptr) ++peers_[out->peer].send_seq;
  if (in != nullptr) ++peers_[in->peer].recv_seq;
  return absl::OkStatus();
}

std::string TcpMesh::ClosedPeers() const {
  std::string closed;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || !peers_[p].fd.valid()) continue;
    pollfd fd{peers_[p].fd.get(), POLLRDHUP, 0};
    if (poll(&fd, 1, 0) == 1 && (fd.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
      absl::StrAppend(&closed, closed.empty() ? "" : ", ", "rank ", p);
    }
  }
  return closed;
}

absl::Status TcpMesh::Fail(absl::StatusCode code, absl::string_view op, absl::string_view what,
                           const OutFrame* out, const InFrame* in, absl::Time start,
                           absl::Time deadline) {
  // If the mesh was already poisoned (Abort from another thread), the
  // socket errors seen here are our own shutdown, not the peer's fault.
  std::string interrupted;
  if (absl::Status prior = poison_status(); !prior.ok()) {
    code = prior.code();
    interrupted = absl::StrCat(" [interrupted: ", prior.message(), "]");
  }
  std::string msg = absl::StrCat("TcpMesh rank ", rank_, " (group '", group_key_, "') ", op);
  if (out != nullptr) absl::StrAppend(&msg, " to peer ", out->peer);
  if (in != nullptr) absl::StrAppend(&msg, out ? " and" : "", " from peer ", in->peer);
  absl::StrAppend(&msg, ": ", what, ";");
  if (out != nullptr) {
    absl::StrAppend(&msg, " sent ", out->payload_done, "/", out->payload.size(), " bytes;");
  }
  if (in != nullptr) {
    absl::StrAppend(&msg, " received ", in->payload_done, "/", in->payload.size(), " bytes;");
  }
  absl::StrAppend(&msg, " elapsed ",
                  absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Microseconds(1))),
                  " of ",
                  absl::FormatDuration(absl::Trunc(deadline - start, absl::Milliseconds(1))),
                  " until the deadline");
  const std::string closed = ClosedPeers();
  if (!closed.empty()) absl::StrAppend(&msg, "; peers with closed connections: ", closed);
  absl::StrAppend(&msg, interrupted);
  absl::Status status(code, msg);
  Poison(status);
  return status;
}

absl::Status TcpMesh::poison_status() const {
  absl::MutexLock lock(&poison_mu_);
  return poisoned_;
}

void TcpMesh::Poison(const absl::Status& status) {
  {
    absl::MutexLock lock(&poison_mu_);
    if (poisoned_.ok()) poisoned_ = status;
  }
  // shutdown() (not close()) keeps the fd numbers valid for a concurrently
  // blocked poll(), which then wakes with POLLHUP.
  for (Peer& peer : peers_) {
    if (peer.fd.valid()) shutdown(peer.fd.get(), SHUT_RDWR);
  }
}

void TcpMesh::Abort(absl::string_view reason) {
  Poison(absl::AbortedError(absl::StrCat("TcpMesh rank ", rank_, " aborted: ", reason)));
}

}  // namespace tpudist::collectives::tcp
