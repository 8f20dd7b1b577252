// TcpMesh: a full mesh of TCP connections among `size` ranks, rendezvoused
// through a c10d::Store, implementing Transport for the ring algorithms.
//
// Rendezvous (Connect):
//   1. Every rank listens on options.bind_address, port 0 (ephemeral), and
//      publishes "address:port" under "<group_key>/tcp_mesh/addr/<rank>".
//   2. Rank r connects to every lower rank p < r (waiting for p's key in the
//      store, retrying refused connects) and accepts one connection from each
//      higher rank. Connect edges only point downwards, so there is no cycle
//      and no rank waits for a rank that waits for it.
//   3. On each new connection both sides send a hello {magic, version, rank,
//      size, flags, 32-byte random nonce, group_key}. With a job secret
//      (options.secret, every rank the same), each side then sends
//      HMAC-SHA256(secret, role label, its own hello, the other's hello) and
//      checks the other's proof in constant time: mutual challenge-response,
//      fresh on both sides, bound to both ranks, the world size and the group
//      key, and to the direction (connector vs acceptor), so a proof cannot
//      be replayed or reflected. The secret never crosses the wire. Only
//      then are the peer's claims trusted: a different version, group key or
//      world size, an unexpected or duplicate rank, is rejected with
//      FailedPrecondition naming both sides.
//   Authentication failures are handled by side. The accepting rank drops a
//   connection that does not authenticate (wrong or missing proof, garbage,
//   a bad magic, silence for options.handshake_timeout), logs one line to
//   stderr naming its address, and keeps waiting for its real peers: a
//   stranger reaching the port cannot fail or feed the mesh. Accepted
//   connections shake hands concurrently (a thread each, at most 64 at
//   once, each joined when it ends and all before Connect returns); a
//   connection arriving when all 64 are taken evicts the oldest (one that
//   has not sent a whole hello first), so silent strangers delay no one but
//   themselves, however many. The connecting
//   rank dialed the address its peer published, so a peer failing to prove
//   the secret there is an error (FailedPrecondition: the ranks were given
//   different secrets).
//   Without a secret (options.secret empty) there is no proof step: any
//   well-formed hello is trusted, as in version 1 of the protocol, and a
//   rank listening on a non-loopback address warns once per process.
//   Everything is bounded by options.connect_timeout; a rank that never shows
//   up makes the others fail with DeadlineExceeded naming it (and the
//   connections dropped meanwhile, if any).
//
// Data path: every socket is non-blocking with TCP_NODELAY. Each Send is one
// frame: a 16-byte header {magic, per-pair sequence number, byte count} and
// the payload, written with sendmsg(MSG_NOSIGNAL). Recv checks the header
// against the expected byte count and sequence, so a size mismatch between
// ranks is reported instead of corrupting later messages. SendRecv drives the
// outgoing and incoming frame together from one poll() loop, so a ring where
// everyone sends multi-MiB buffers at once cannot deadlock on full socket
// buffers; Exchange does the same for any number of peers at once. Byte
// order is native: all ranks must share endianness (a mismatch shows up as
// a bad magic at the handshake).
//
// Errors: messages name this rank, the peer(s), the op, bytes done/total and
// the time elapsed vs the deadline. A peer that closes or resets its socket
// (EOF, ECONNRESET, EPIPE: e.g. its process died) yields Unavailable naming
// it; running past the deadline yields DeadlineExceeded. After the first
// error the mesh is poisoned: later calls return FailedPrecondition carrying
// the first error, and all connections are shut down so that peers blocked on
// this rank fail promptly instead of at their own deadline.
//
// Ownership: the mesh owns its sockets; the store is only used inside Connect
// and is not retained.
// Thread-safety: thread-compatible. One operation at a time; callers (a
// process group's worker thread) must serialise Send/Recv/SendRecv. The one
// exception is Abort() and poison_status(), which are thread-safe and may be
// called from any thread (e.g. a watchdog) while an operation is blocked: the
// blocked operation then fails promptly.

#ifndef TPU_DIST_COLLECTIVES_TCP_TCP_MESH_H_
#define TPU_DIST_COLLECTIVES_TCP_TCP_MESH_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "collectives/tcp/tcp_socket.h"
#include "collectives/tcp/transport.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace tpudist::collectives::tcp {

struct TcpMeshOptions {
  // Prefix of the store keys, and part of the handshake: meshes with
  // different keys never talk to each other. Must be unique per mesh
  // instance within a store (keys are not deleted afterwards).
  std::string group_key = "tcp_mesh";
  // Numeric address to listen on (IPv4 or IPv6).
  std::string bind_address = "127.0.0.1";
  // Address peers should dial; empty means bind_address. Required when
  // bind_address is a wildcard ("0.0.0.0", "::").
  std::string advertise_address;
  // Bound on the whole of Connect: store waits, connects and handshakes.
  absl::Duration connect_timeout = absl::Seconds(60);
  // The job secret's bytes (tpu_runtime/job_secret.h); every rank of the
  // mesh needs the same. Empty: connections are not authenticated.
  std::string secret;
  // How long an accepted connection may take to complete its handshake
  // before it is dropped (a real peer has sent its hello already and needs
  // one round trip): bounds what a silent stranger delays the rendezvous.
  absl::Duration handshake_timeout = absl::Seconds(10);
  // SO_SNDBUF/SO_RCVBUF per connection; 0 keeps the kernel's autotuning.
  int socket_buffer_bytes = 0;
};

class TcpMesh final : public Transport {
 public:
  // Builds the full mesh for `rank` of `size` (see the file comment).
  // REQUIRES: 0 <= rank < size; every rank calls it with the same size and
  // options.group_key.
  static absl::StatusOr<std::unique_ptr<TcpMesh>> Connect(c10d::Store& store, int rank, int size,
                                                          const TcpMeshOptions& options);
  ~TcpMesh() override;
  TcpMesh(const TcpMesh&) = delete;
  TcpMesh& operator=(const TcpMesh&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status Send(int peer, absl::Span<const uint8_t> data, absl::Time deadline) override;
  absl::Status Recv(int peer, absl::Span<uint8_t> data, absl::Time deadline) override;
  absl::Status SendRecv(int send_peer, absl::Span<const uint8_t> send, int recv_peer,
                        absl::Span<uint8_t> recv, absl::Time deadline) override;
  // Pushes as much of `send` as the socket buffer takes and pulls what has
  // arrived, runs `overlap` while the kernel moves those bytes, then finishes.
  absl::Status SendRecvOverlapped(int send_peer, absl::Span<const uint8_t> send, int recv_peer,
                                  absl::Span<uint8_t> recv, absl::FunctionRef<void()> overlap,
                                  absl::Time deadline) override;
  // Moves every block at once: all frames progress from one poll() loop
  // over the listed sockets (no step waits for the slowest pair). Errors
  // name the peer whose frame failed; on a deadline, the first unfinished
  // send and receive.
  absl::Status Exchange(absl::Span<const SendBlock> sends, absl::Span<const RecvBlock> recvs,
                        absl::Time deadline) override;

  // Poisons the mesh with Aborted(`reason`) and shuts every connection down:
  // a blocked operation on this mesh fails promptly, and peers see this rank
  // as gone. Idempotent; the first error (abort or failure) is kept.
  // Thread-safe.
  void Abort(absl::string_view reason) ABSL_LOCKS_EXCLUDED(poison_mu_);

  // OK until the mesh is poisoned; then the first error. Thread-safe.
  absl::Status poison_status() const ABSL_LOCKS_EXCLUDED(poison_mu_);

 private:
  struct Peer {
    ScopedFd fd;
    uint32_t send_seq = 0;  // Sequence number of the next frame sent.
    uint32_t recv_seq = 0;  // Sequence number expected on the next frame.
  };
  struct OutFrame;
  struct InFrame;
  struct PendingHandshake;

  TcpMesh(int rank, int size, std::string group_key);

  // Connect's two halves.
  absl::Status ConnectLower(c10d::Store& store, const TcpMeshOptions& options, absl::Time deadline);
  absl::Status AcceptHigher(int listen_fd, const TcpMeshOptions& options, absl::Time deadline);
  // One side of the hello (+ proof) exchange on `fd`. `expected_peer` >= 0
  // on the connecting side, -1 on the accepting side. `*authenticated` is
  // set once the peer proved the secret (or, without one, sent a
  // well-formed hello): a failure before that point is the peer's
  // untrustworthiness, after it a disagreement within the job. Sets
  // *got_hello (if given) once the peer's whole hello is read.
  absl::Status Handshake(int fd, int expected_peer, absl::string_view where,
                         const std::string& secret, absl::Time deadline, int* peer_rank,
                         bool* authenticated, std::atomic<bool>* got_hello = nullptr);

  // Validates a peer argument and the poison state.
  absl::Status CheckOp(absl::string_view op, int peer) const;
  // Moves `out` and/or `in` (either may be null) to completion. If
  // `overlap` is set, runs it (once) after the first non-blocking pass.
  // `*overlap` is reset to null once it has run.
  absl::Status Transfer(absl::string_view op, OutFrame* out, InFrame* in, absl::Time deadline,
                        absl::FunctionRef<void()>** overlap = nullptr);
  // Records `status` as the poison (if first) and shuts all sockets down.
  void Poison(const absl::Status& status) ABSL_LOCKS_EXCLUDED(poison_mu_);
  // Builds the error for a failed Transfer, then poisons the mesh.
  absl::Status Fail(absl::StatusCode code, absl::string_view op, absl::string_view what,
                    const OutFrame* out, const InFrame* in, absl::Time start, absl::Time deadline);
  // Comma-separated ranks whose connection shows a hang-up right now.
  std::string ClosedPeers() const;

  const int rank_;
  const int size_;
  const std::string group_key_;
  std::vector<Peer> peers_;  // [size]; peers_[rank_] unused. Fds fixed after Connect.
  mutable absl::Mutex poison_mu_;
  absl::Status poisoned_ ABSL_GUARDED_BY(poison_mu_);
};

}  // namespace tpudist::collectives::tcp

#endif  // TPU_DIST_COLLECTIVES_TCP_TCP_MESH_H_
