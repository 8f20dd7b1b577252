#include "tpu_runtime/coordination/service_listener.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "grpcpp/server.h"
#include "grpcpp/server_posix.h"

namespace tpudist::tpu_runtime::coordination {
namespace {

// How often the accept thread looks at stopping_.
constexpr int kPollMs = 100;
// Refusals logged one by one, then at most one line per interval.
constexpr int64_t kLoggedOneByOne = 10;
constexpr absl::Duration kLogInterval = absl::Seconds(10);

std::string PeerString(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return absl::StrCat("ipv4:", host, ":", ntohs(in->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return absl::StrCat("ipv6:[", host, "]:", ntohs(in6->sin6_port));
  }
  return "unknown";
}

}  // namespace

int CountOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // the directory's own descriptor
}

int64_t FdSoftLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) {
    return -1;
  }
  return static_cast<int64_t>(rl.rlim_cur);
}

int64_t DefaultFdReserve(int64_t soft_limit) {
  return std::clamp<int64_t>(soft_limit / 4, 16, 4096);
}

ServiceListener::ServiceListener(ListenerOptions options, int fd, int port)
    : options_(std::move(options)), fd_(fd), port_(port) {}

ServiceListener::~ServiceListener() { Stop(); }

absl::StatusOr<std::unique_ptr<ServiceListener>> ServiceListener::Bind(
    const ListenerOptions& options) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = absl::StrCat(options.port);
  const std::string where = absl::StrCat(options.bind_address, ":", port);
  if (const int rc = getaddrinfo(options.bind_address.c_str(), port.c_str(),
                                 &hints, &found);
      rc != 0) {
    return absl::UnavailableError(absl::StrFormat(
        "coordination service of job '%s': cannot resolve %s: %s",
        options.job_id, where, gai_strerror(rc)));
  }
  std::string error = "no address";
  int fd = -1;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                a->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 4096) == 0) {
      break;
    }
    error = std::strerror(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrFormat(
        "coordination service of job '%s': cannot listen on %s: %s",
        options.job_id, where, error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port =
      bound.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
          : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<ServiceListener>(
      new ServiceListener(options, fd, bound_port));
}

void ServiceListener::Start(grpc::Server* server) {
  thread_ = std::thread([this, server] {
    pthread_setname_np(pthread_self(), "tpud-coord-acc");
    AcceptLoop(server);
  });
}

void ServiceListener::Stop() {
  stopping_.store(true);
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
}

void ServiceListener::AcceptLoop(grpc::Server* server) {
  // A descriptor held back for EMFILE: freed to accept (and close) the
  // connection at the head of the backlog, so the loop does not spin on it.
  int spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
  while (!stopping_.load()) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, kPollMs) <= 0) continue;
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int conn = accept4(fd_, reinterpret_cast<sockaddr*>(&addr), &len,
                             SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn >= 0) {
      Admit(server, conn, PeerString(addr));
      continue;
    }
    if (errno != EMFILE && errno != ENFILE) continue;  // EAGAIN, ECONNABORTED
    const int err = errno;
    if (spare >= 0) {
      close(spare);
      const int drop = accept4(fd_, reinterpret_cast<sockaddr*>(&addr), &len,
                               SOCK_CLOEXEC);
      if (drop >= 0) close(drop);
      spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    } else {
      absl::SleepFor(absl::Milliseconds(kPollMs));
    }
    refused_.fetch_add(1);
    LogRefusal(absl::StrFormat(
        "accept failed: %s (%s): this process has no file descriptor left "
        "(ulimit -n %d); the connection at the head of the queue was closed",
        std::strerror(err), err == EMFILE ? "EMFILE" : "ENFILE",
        FdSoftLimit()));
  }
  if (spare >= 0) close(spare);
}

void ServiceListener::Admit(grpc::Server* server, int fd,
                            const std::string& peer) {
  const int64_t limit = FdSoftLimit();
  const int64_t reserve = options_.fd_reserve > 0 ? options_.fd_reserve
                                                  : DefaultFdReserve(limit);
  const int open_fds = CountOpenFds();
  if (limit > 0 && open_fds >= 0 && open_fds > limit - reserve) {
    close(fd);
    refused_.fetch_add(1);
    LogRefusal(absl::StrFormat(
        "refused a connection from %s: this process has %d of %d file "
        "descriptors open (ulimit -n) and keeps the last %d for its own files "
        "(checkpoints, collectives) rather than run into 'Too many open "
        "files'",
        peer, open_fds, limit, reserve));
    return;
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  {
    absl::MutexLock lock(&mu_);
    peers_[fd] = peer;
  }
  grpc::AddInsecureChannelFromFd(server, fd);
}

std::string ServiceListener::PeerAddress(const std::string& grpc_peer) const {
  int fd = -1;
  if (!absl::StartsWith(grpc_peer, "fd:") ||
      !absl::SimpleAtoi(absl::string_view(grpc_peer).substr(3), &fd)) {
    return grpc_peer;
  }
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(fd);
  return it == peers_.end() ? grpc_peer : it->second;
}

void ServiceListener::LogRefusal(const std::string& why) {
  const int64_t n = refused_.load();
  const absl::Time now = absl::Now();
  if (n > kLoggedOneByOne && now - last_log_ < kLogInterval) return;
  last_log_ = now;
  std::fprintf(stderr,
               "[coordination] job '%s', port %d: %s; %lld connection(s) "
               "refused so far (%lld since the last line). Idle connections "
               "are closed after the idle timeout; if these are not the job's "
               "ranks, something on the network is flooding this port\n",
               options_.job_id.c_str(), port_, why.c_str(),
               static_cast<long long>(n),
               static_cast<long long>(n - logged_refused_));
  logged_refused_ = n;
}

}  // namespace tpudist::tpu_runtime::coordination
