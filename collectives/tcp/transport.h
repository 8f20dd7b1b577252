// The point-to-point interface the ring algorithms are written against.
//
// Like Gloo's pair/buffer split, algorithms (ring_algorithms.h) know nothing
// about sockets: they only ask a Transport to move bytes between ranks. TcpMesh
// (tcp_mesh.h) is the real implementation; InMemoryTransport
// (in_memory_transport.h) runs the same algorithms between threads for tests.
//
// Message semantics, which every implementation must honour:
//   * Each Send(peer, buf) is one message; the matching Recv on `peer` must
//     pass a buffer of exactly buf.size() bytes (a mismatch is an error, never
//     a silent truncation). Zero-byte messages are legal and still matched.
//   * Messages between an ordered pair (src, dst) arrive in send order.
//   * SendRecv sends to `send_peer` and receives from `recv_peer` at the same
//     time; it must not deadlock when every rank of a ring calls it at once,
//     whatever the buffer sizes. send_peer and recv_peer may be equal.
//   * A peer equal to rank() or out of range is rejected with
//     InvalidArgument before any I/O; that alone does not poison.
//   * Every call returns by `deadline` (DeadlineExceeded otherwise).
//   * After any failure of the transfer itself (deadline, peer gone, size
//     mismatch, I/O error) the transport is poisoned: every later call fails
//     with FailedPrecondition. Collectives are all-or-nothing; there is no
//     resynchronisation.
//
// Thread-safety: implementations are thread-compatible, i.e. one call at a
// time per Transport object (the caller serialises collectives).

#ifndef TPU_DIST_COLLECTIVES_TCP_TRANSPORT_H_
#define TPU_DIST_COLLECTIVES_TCP_TRANSPORT_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tpudist::collectives::tcp {

// One block of an Exchange: the bytes for (from) `peer`.
struct SendBlock {
  int peer = -1;
  absl::Span<const uint8_t> data;
};
struct RecvBlock {
  int peer = -1;
  absl::Span<uint8_t> data;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // This process's rank in [0, size()).
  virtual int rank() const = 0;
  // Number of ranks in the group (>= 1).
  virtual int size() const = 0;

  // Sends `data` as one message to `peer`. Returns once the bytes are handed
  // to the transport (not necessarily received).
  virtual absl::Status Send(int peer, absl::Span<const uint8_t> data, absl::Time deadline) = 0;

  // Receives one message of exactly data.size() bytes from `peer` into `data`.
  virtual absl::Status Recv(int peer, absl::Span<uint8_t> data, absl::Time deadline) = 0;

  // Send(send_peer, send) and Recv(recv_peer, recv) concurrently. `send` and
  // `recv` must not overlap.
  virtual absl::Status SendRecv(int send_peer, absl::Span<const uint8_t> send, int recv_peer,
                                absl::Span<uint8_t> recv, absl::Time deadline) = 0;

  // As SendRecv, and runs `overlap` exactly once, whether or not the transfer
  // succeeds. An implementation that can runs it after it has started the
  // transfer and before it waits for it, so that computation on other
  // buffers (the ring's reduction of the previous segment) overlaps the
  // network. `overlap` must not touch `send` or `recv`. The default runs it
  // after a plain SendRecv (no overlap).
  virtual absl::Status SendRecvOverlapped(int send_peer, absl::Span<const uint8_t> send,
                                          int recv_peer, absl::Span<uint8_t> recv,
                                          absl::FunctionRef<void()> overlap, absl::Time deadline) {
    absl::Status s = SendRecv(send_peer, send, recv_peer, recv, deadline);
    overlap();
    return s;
  }

  // Sends every block of `sends` to its peer and receives every block of
  // `recvs` from its peer, one message each; a collective step in which
  // every rank calls Exchange. The default runs the pairwise schedule
  // (pairwise_exchange.h): step s in [1, W-1] sends to rank + s and
  // receives from rank - s where listed, one SendRecv / Send / Recv per
  // step. An implementation may instead move all blocks at once (TcpMesh:
  // one poll loop over every listed socket).
  // REQUIRES: each peer at most once per list, none == rank(); the lists
  // match across ranks (r lists p in sends iff p lists r in recvs, with the
  // same size); no send block overlaps a receive block.
  virtual absl::Status Exchange(absl::Span<const SendBlock> sends,
                                absl::Span<const RecvBlock> recvs, absl::Time deadline);
};

}  // namespace tpudist::collectives::tcp

#endif  // TPU_DIST_COLLECTIVES_TCP_TRANSPORT_H_
