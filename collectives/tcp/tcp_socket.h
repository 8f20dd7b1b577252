// Thin, deadline-aware wrappers over POSIX TCP sockets used by TcpMesh:
// an owning fd, listen/accept/connect with deadlines, socket options, and
// whole-buffer reads and writes on non-blocking sockets driven by poll().
//
// Every blocking helper takes an absl::Time deadline and returns
// DeadlineExceeded when it passes; none of them spins. Error messages carry
// the syscall and errno name; callers (TcpMesh) add rank/peer/op context.
// Sends use MSG_NOSIGNAL so a dead peer yields EPIPE, never SIGPIPE.
//
// Thread-safety: free functions are thread-safe; a ScopedFd is
// thread-compatible.

#ifndef TPU_DIST_COLLECTIVES_TCP_TCP_SOCKET_H_
#define TPU_DIST_COLLECTIVES_TCP_TCP_SOCKET_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tpudist::collectives::tcp {

// Owns a file descriptor; closes it on destruction. Move-only.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() { Reset(); }
  ScopedFd(ScopedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes the fd (if any) and takes `fd` instead.
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// A listening socket and the port it is bound to.
struct Listener {
  ScopedFd fd;
  int port = 0;
};

// "host:port" -> {host, port}. Splits at the last ':' so bare IPv6 literals
// work; brackets around the host are stripped.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view host_port);

// {host, port} -> "host:port", bracketing IPv6 literals: "[::1]:80".
std::string JoinHostPort(absl::string_view host, int port);

// Binds a non-blocking TCP listener to numeric address `address` (IPv4 or
// IPv6) and `port` (0 = ephemeral), with SO_REUSEADDR.
absl::StatusOr<Listener> ListenTcp(const std::string& address, int port, int backlog);

// Accepts one connection on non-blocking listener `listen_fd`, waiting no
// later than `deadline`. The returned socket is non-blocking.
absl::StatusOr<ScopedFd> AcceptUntil(int listen_fd, absl::Time deadline);

// The remote "address:port" of connected socket `fd` ("?" if unknown):
// names a dropped peer in logs.
std::string PeerAddress(int fd);

// Accepts one connection on non-blocking listener `listen_fd` without
// waiting: NotFound when none is pending. *from gets its remote
// "address:port" (known even when it has already been reset).
absl::StatusOr<ScopedFd> AcceptNow(int listen_fd, std::string* from);

// True for 127.0.0.0/8 and ::1 (numeric addresses only).
bool IsLoopbackNumeric(absl::string_view address);

// Connects to host:port, retrying refused/unreachable attempts with a capped
// backoff until `deadline`. The returned socket is non-blocking.
absl::StatusOr<ScopedFd> ConnectUntil(const std::string& host, int port, absl::Time deadline);

// Sets TCP_NODELAY, and SO_SNDBUF/SO_RCVBUF when buffer_bytes > 0.
absl::Status ConfigureStream(int fd, int buffer_bytes);

// Waits on poll() for `events` on `fd` until `deadline`. Returns the revents,
// or DeadlineExceeded. EINTR is retried.
absl::StatusOr<short> PollUntil(int fd, short events, absl::Time deadline);

// Writes/reads all of `data` on a non-blocking socket before `deadline`.
// EOF while reading is Unavailable("connection closed").
absl::Status WriteAll(int fd, absl::Span<const uint8_t> data, absl::Time deadline);
absl::Status ReadAll(int fd, absl::Span<uint8_t> data, absl::Time deadline);

// Milliseconds from now until `deadline`, clamped to [0, INT_MAX], rounded up
// so that a poll never returns just before the deadline and spins.
int PollTimeoutMs(absl::Time deadline);

// "ECONNRESET (Connection reset by peer)".
std::string ErrnoString(int err);

// True for errno values that mean the peer is gone.
bool IsPeerGoneErrno(int err);

}  // namespace tpudist::collectives::tcp

#endif  // TPU_DIST_COLLECTIVES_TCP_TCP_SOCKET_H_
