#include "collectives/tcp/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tpudist::collectives::tcp {
namespace {

absl::Status ErrnoStatus(absl::string_view what, int err) {
  std::string msg = absl::StrCat(what, ": ", ErrnoString(err));
  if (IsPeerGoneErrno(err)) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

absl::Status SetNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return ErrnoStatus("fcntl(O_NONBLOCK)", errno);
  }
  return absl::OkStatus();
}

// Resolves a numeric or named host and port to the first TCP address.
absl::Status Resolve(const std::string& host, int port, bool passive, sockaddr_storage* out,
                     socklen_t* out_len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", host, ":", port, "': ", gai_strerror(rc)));
  }
  std::memcpy(out, res->ai_addr, res->ai_addrlen);
  *out_len = res->ai_addrlen;
  freeaddrinfo(res);
  return absl::OkStatus();
}

}  // namespace

void ScopedFd::Reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

std::string ErrnoString(int err) {
  const char* name = strerrorname_np(err);
  return absl::StrCat(name ? name : "errno " + std::to_string(err), " (", strerror(err), ")");
}

bool IsPeerGoneErrno(int err) {
  return err == ECONNRESET || err == EPIPE || err == ECONNABORTED || err == ENOTCONN ||
         err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH;
}

int PollTimeoutMs(absl::Time deadline) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view host_port) {
  size_t colon = host_port.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(host_port.substr(colon + 1), &port) ||
      port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad 'host:port' '", host_port, "'"));
  }
  absl::string_view host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(std::string(host), port);
}

std::string JoinHostPort(absl::string_view host, int port) {
  const bool bracket = host.find(':') != absl::string_view::npos && host.front() != '[';
  return absl::StrCat(bracket ? "[" : "", host, bracket ? "]" : "", ":", port);
}

absl::StatusOr<Listener> ListenTcp(const std::string& address, int port, int backlog) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (absl::Status s = Resolve(address, port, /*passive=*/true, &addr, &len); !s.ok()) return s;
  Listener listener;
  listener.fd.Reset(socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener.fd.valid()) return ErrnoStatus("socket", errno);
  int one = 1;
  setsockopt(listener.fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(listener.fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return ErrnoStatus(absl::StrCat("bind(", address, ":", port, ")"), errno);
  }
  if (listen(listener.fd.get(), backlog) != 0) return ErrnoStatus("listen", errno);
  if (absl::Status s = SetNonBlocking(listener.fd.get()); !s.ok()) return s;
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  if (getsockname(listener.fd.get(), reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0) {
    return ErrnoStatus("getsockname", errno);
  }
  listener.port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return listener;
}

absl::StatusOr<short> PollUntil(int fd, short events, absl::Time deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int timeout = PollTimeoutMs(deadline);
    int rc = poll(&p, 1, timeout);
    if (rc > 0) return p.revents;
    if (rc < 0 && errno != EINTR) return ErrnoStatus("poll", errno);
    if (rc == 0 && absl::Now() >= deadline) return absl::DeadlineExceededError("poll timed out");
  }
}

absl::StatusOr<ScopedFd> AcceptUntil(int listen_fd, absl::Time deadline) {
  while (true) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) return ScopedFd(fd);
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
      return ErrnoStatus("accept", errno);
    }
    absl::StatusOr<short> ready = PollUntil(listen_fd, POLLIN, deadline);
    if (!ready.ok()) return ready.status();
  }
}

namespace {

std::string AddressString(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return JoinHostPort(text, ntohs(in->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    return JoinHostPort(text, ntohs(in6->sin6_port));
  }
  return "?";
}

}  // namespace

std::string PeerAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  return AddressString(addr);
}

absl::StatusOr<ScopedFd> AcceptNow(int listen_fd, std::string* from) {
  while (true) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      *from = AddressString(addr);
      return ScopedFd(fd);
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return absl::NotFoundError("no connection pending");
    }
    return ErrnoStatus("accept", errno);
  }
}

bool IsLoopbackNumeric(absl::string_view address) {
  return absl::StartsWith(address, "127.") || address == "::1" || address == "[::1]";
}

absl::StatusOr<ScopedFd> ConnectUntil(const std::string& host, int port, absl::Time deadline) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (absl::Status s = Resolve(host, port, /*passive=*/false, &addr, &len); !s.ok()) return s;
  absl::Duration backoff = absl::Milliseconds(5);
  int last_err = 0;
  while (true) {
    ScopedFd fd(socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return ErrnoStatus("socket", errno);
    int rc = connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      absl::StatusOr<short> ready = PollUntil(fd.get(), POLLOUT, deadline);
      if (!ready.ok()) {
        return absl::DeadlineExceededError(
            absl::StrCat("connect to ", host, ":", port, " did not complete before the deadline"));
      }
      socklen_t err_len = sizeof(err);
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &err_len);
    }
    if (err == 0) return fd;
    last_err = err;
    const bool retryable = err == ECONNREFUSED || err == ETIMEDOUT || err == EHOSTUNREACH ||
                           err == ENETUNREACH || err == EAGAIN || err == EINTR;
    if (!retryable) return ErrnoStatus(absl::StrCat("connect to ", host, ":", port), err);
    if (absl::Now() + backoff >= deadline) break;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(absl::StrCat("connect to ", host, ":", port,
                                                  " kept failing until the deadline, last error ",
                                                  ErrnoString(last_err)));
}

absl::Status ConfigureStream(int fd, int buffer_bytes) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return ErrnoStatus("setsockopt(TCP_NODELAY)", errno);
  }
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, absl::Span<const uint8_t> data, absl::Time deadline) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return ErrnoStatus("send", errno);
    }
    absl::StatusOr<short> ready = PollUntil(fd, POLLOUT, deadline);
    if (!ready.ok()) return ready.status();
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, absl::Span<uint8_t> data, absl::Time deadline) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = recv(fd, data.data() + done, data.size() - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return absl::UnavailableError("connection closed (EOF)");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return ErrnoStatus("recv", errno);
    }
    absl::StatusOr<short> ready = PollUntil(fd, POLLIN, deadline);
    if (!ready.ok()) return ready.status();
  }
  return absl::OkStatus();
}

}  // namespace tpudist::collectives::tcp
