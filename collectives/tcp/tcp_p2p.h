// TcpP2p: point-to-point messages (send/recv with a tag) between the ranks of
// a group over dedicated TCP connections, one per ordered pair, made lazily.
// The process group's send/recv use it (process_group_tpu_dist.h) instead of
// the store; it is independent of the collective mesh and its buffers, so a
// pending recv never holds up a collective, and vice versa.
//
// Rendezvous: Start() listens on options.bind_address (port 0) and publishes
// "p2p/addr/<rank>" in the store; it waits for nobody. The first Send from a
// to b waits (bounded by its deadline) for b's key, connects, and runs the
// handshake; that connection then carries every a -> b message, in order.
// b's accept thread takes the connection and gives it a reader thread.
//
// Handshake: both sides send a hello {magic, version, own rank, expected peer
// rank, size, flags, 32-byte nonce, group key}. With a job secret each then
// sends HMAC-SHA256(secret, role label, own hello, peer's hello) and checks
// the other's proof in constant time (the scheme tcp_mesh.h describes, under
// its own labels, so a proof for one protocol is never valid for the other).
// The accepting side drops a connection that fails the handshake and keeps
// serving: a stranger cannot feed or fail a recv.
//
// Strangers: an accepted connection must authenticate within
// options.handshake_timeout of its accept (5 s; a real peer sends its hello
// with its connect and needs one round trip). Until its whole fixed-size
// hello has arrived it costs no thread: the accept thread polls it (with
// SO_RCVLOWAT = the hello's size) among at most 64 such connections, drops
// it if it closes or sends something that is not a hello, and when all 64
// are taken evicts the oldest for a newcomer, so silent strangers never keep
// a real peer out. A connection with a hello gets a reader thread for the
// rest of the handshake (at most 64 unauthenticated ones at once, the oldest
// evicted likewise) and, once authenticated, for its frames. The accept
// thread joins (reaps) every reader whose connection ended within 0.5 s:
// threads, stacks and fds stay bounded however many strangers connect. Drops
// are logged to stderr, rate-limited: the first 10, then at most one line
// per 10 s carrying the count of those not shown.
//
// Data path: a frame is a 16-byte header {magic, tag, byte count} and the
// payload. The reader thread drains its socket continuously into per-(peer,
// tag) queues, so Send returns once the bytes are in the kernel and never
// waits for the matching Recv (sends are buffered; two ranks that both send
// before they receive do not deadlock at any size). Recv takes the oldest
// queued message of (peer, tag) and copies it out; a Recv already waiting
// when its frame arrives gets the payload read straight into its buffer.
//
// Errors name this rank, the peer, the tag, the bytes and the deadline. A
// peer whose connection closes (its process died, or it destroyed its group)
// fails every Recv waiting on it once its queued messages are consumed, with
// Unavailable naming it; a failed Send is sticky for that peer. Abort() fails
// everything promptly, a Send blocked on a full socket (peer not reading)
// included; a Send still waiting for the peer's address is bounded by its
// deadline.
//
// Ownership: owns its sockets and threads; the store is used only inside
// Start() and Send() and is not retained.
// Thread-safety: Send, Recv and Abort are thread-safe. Sends to one peer are
// serialised (a message is never interleaved with another).
#ifndef TPU_DIST_COLLECTIVES_TCP_TCP_P2P_H_
#define TPU_DIST_COLLECTIVES_TCP_TCP_P2P_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "collectives/core/p2p_inbox.h"
#include "collectives/tcp/tcp_socket.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace tpudist::collectives::tcp {

struct TcpP2pOptions {
  // Part of the handshake: peers of another group key are refused.
  std::string group_key = "p2p";
  std::string bind_address = "127.0.0.1";  // numeric
  std::string advertise_address;           // "" = bind_address
  std::string secret;                      // job secret bytes; "" = none
  // How long an accepted connection may take to authenticate before it is
  // dropped (bounds what a silent stranger holds; a real peer needs one
  // round trip).
  absl::Duration handshake_timeout = absl::Seconds(5);
};

class TcpP2p {
 public:
  // Listens, publishes this rank's address in `store` and starts the accept
  // thread. Not collective. REQUIRES: 0 <= rank < size.
  static absl::StatusOr<std::unique_ptr<TcpP2p>> Start(c10d::Store& store, int rank, int size,
                                                       const TcpP2pOptions& options);
  // Shuts every connection down and joins the threads.
  ~TcpP2p();
  TcpP2p(const TcpP2p&) = delete;
  TcpP2p& operator=(const TcpP2p&) = delete;

  // Sends `data` to `dst` under `tag`; connects first if this is the first
  // message to `dst` (waiting in `store` for its address). Returns once the
  // bytes are handed to the kernel. REQUIRES: dst != rank, 0 <= dst < size.
  absl::Status Send(c10d::Store& store, int dst, int tag, absl::Span<const uint8_t> data,
                    absl::Time deadline);
  // Receives the next message from `src` under `tag` into `data`, which must
  // be its exact size (else InvalidArgument; the message is consumed).
  absl::Status Recv(int src, int tag, absl::Span<uint8_t> data, absl::Time deadline);
  // Fails in-flight and later Send/Recv with `cause`. Idempotent.
  void Abort(const absl::Status& cause);

 private:
  struct OutLink {
    absl::Mutex mu;
    ScopedFd fd ABSL_GUARDED_BY(mu);
    absl::Status error ABSL_GUARDED_BY(mu);  // sticky after a failed send
    // fd's number once connected, for Abort: a Send blocked in write() holds
    // mu for as long as its deadline allows, so Abort shuts the socket down
    // through this copy instead of waiting for mu. The fd is set once and
    // closed only by the destructor, so the number is never reused under it.
    std::atomic<int> abort_fd{-1};
  };
  using Message = P2pMessage;
  // A Recv waiting with nothing queued: the reader thread may read the
  // next frame of that tag and size straight into `data` (no second copy).
  using Posted = P2pPosted;
  struct InPeer : P2pInbox {  // closed: OK while connected / not yet
    bool connected = false;
  };
  // An accepted connection and the thread serving it: the handshake (while
  // unauthenticated, "pending"), then the frames of the rank it proved to be.
  // The fields marked mu_ are guarded by mu_.
  struct Reader {
    ScopedFd fd;         // closed after `thread` is joined (Reap)
    std::string from;    // remote address, for logs
    absl::Time accepted;
    bool authenticated = false;          // mu_
    bool evicted = false;                // mu_: shut down to make room
    bool done = false;                   // mu_: the thread is exiting
    std::thread thread;
  };

  TcpP2p(int rank, int size, TcpP2pOptions options, Listener listener);
  // Connects `link` (out_[dst]).
  absl::Status Connect(c10d::Store& store, int dst, OutLink& link, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(link.mu);
  // One side of the hello (+ proof) exchange. `expected_peer` >= 0 when
  // connecting; -1 when accepting (then *peer_rank is who the peer proved to
  // be).
  absl::Status Handshake(int fd, int expected_peer, absl::Time deadline, int* peer_rank);
  // The size of the fixed part of a hello, and whether `bytes` (that many)
  // start one of this protocol version.
  static size_t HelloBytes();
  static bool IsHello(const uint8_t* bytes);
  // Accepts connections and holds them, threadless, until a hello arrives.
  void AcceptLoop();
  // Gives a connection whose hello has arrived a reader thread; makes room
  // first (see the file comment), or refuses it when even that cannot be
  // done.
  void AddReader(ScopedFd fd, std::string from, absl::Time accepted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Joins the readers whose threads are exiting and closes their sockets.
  void Reap() ABSL_LOCKS_EXCLUDED(mu_);
  // Handshake, then frames until the connection closes.
  void ReadLoop(Reader* reader);
  // One stderr line per dropped connection, rate-limited.
  void LogDrop(const std::string& from, absl::string_view reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Context() const;

  const int rank_;
  const int size_;
  const TcpP2pOptions options_;
  Listener listener_;
  std::vector<std::unique_ptr<OutLink>> out_;  // [size]; out_[rank_] unused

  absl::Mutex mu_;
  absl::CondVar cv_;  // signalled on every delivered message / close / abort
  std::vector<InPeer> in_ ABSL_GUARDED_BY(mu_);  // [size]
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Accepted connections in accept order, until reaped.
  std::list<std::unique_ptr<Reader>> readers_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;          // connections dropped so far
  int64_t drops_not_logged_ ABSL_GUARDED_BY(mu_) = 0;  // since the last line
  absl::Time last_drop_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread acceptor_;
};

}  // namespace tpudist::collectives::tcp

#endif  // TPU_DIST_COLLECTIVES_TCP_TCP_P2P_H_
