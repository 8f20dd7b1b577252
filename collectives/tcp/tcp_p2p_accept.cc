// TcpP2p's accept side: the accept thread, the bounded sets of connections
// waiting for their hello and of unauthenticated readers, reaping finished
// readers and the rate-limited drop log. See tcp_p2p.h, "Strangers".
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/tcp/tcp_p2p.h"

namespace tpudist::collectives::tcp {
namespace {

// Connections held (without a thread) until their hello arrives, and
// unauthenticated connections with a reader thread, at most at once each.
constexpr size_t kMaxWaiting = 64;
constexpr int kMaxPending = 64;
// Drop log: the first lines in full, then one line per interval.
constexpr int64_t kDropLogLines = 10;
constexpr absl::Duration kDropLogInterval = absl::Seconds(10);
// The accept thread reaps finished readers at least this often.
constexpr absl::Duration kReapInterval = absl::Milliseconds(500);

// An accepted connection whose hello has not arrived yet.
struct Waiting {
  ScopedFd fd;
  std::string from;
  absl::Time accepted;
};

void SetReceiveLowWater(int fd, int bytes) {
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof(bytes));
}

}  // namespace

void TcpP2p::AcceptLoop() {
  const int listen_fd = listener_.fd.get();
  const int hello_bytes = static_cast<int>(HelloBytes());
  std::deque<Waiting> waiting;  // in accept order
  std::vector<pollfd> fds;
  std::vector<uint8_t> peek(HelloBytes());
  while (true) {
    Reap();
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      // Silent past the deadline: dropped.
      const absl::Time now = absl::Now();
      while (!waiting.empty() && now >= waiting.front().accepted + options_.handshake_timeout) {
        LogDrop(waiting.front().from,
                absl::StrCat("no hello within handshake_timeout ",
                             absl::FormatDuration(options_.handshake_timeout)));
        waiting.pop_front();
      }
    }
    absl::Time wake = absl::Now() + kReapInterval;
    if (!waiting.empty()) {
      wake = std::min(wake, waiting.front().accepted + options_.handshake_timeout);
    }
    // The destructor's shutdown() of the listener wakes this poll.
    fds.assign(1, pollfd{listen_fd, POLLIN, 0});
    for (const Waiting& w : waiting) fds.push_back(pollfd{w.fd.get(), POLLIN | POLLRDHUP, 0});
    if (poll(fds.data(), fds.size(), PollTimeoutMs(wake)) < 0 && errno != EINTR) {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(100));
      continue;
    }
    // Waiting connections that sent their hello, closed or failed (the
    // low-water mark makes POLLIN mean "a whole hello" or end of stream).
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      size_t kept = 0;
      for (size_t i = 0; i < waiting.size(); ++i) {
        Waiting& w = waiting[i];
        if (fds[i + 1].revents == 0) {
          if (kept != i) waiting[kept] = std::move(w);
          ++kept;
          continue;
        }
        const ssize_t n = recv(w.fd.get(), peek.data(), peek.size(), MSG_PEEK | MSG_DONTWAIT);
        if (n == hello_bytes && IsHello(peek.data())) {
          SetReceiveLowWater(w.fd.get(), 1);
          AddReader(std::move(w.fd), std::move(w.from), w.accepted);
        } else if (n == hello_bytes) {
          LogDrop(w.from, "not a tpu_dist p2p peer (v1): its first bytes are not a hello");
        } else {
          LogDrop(w.from, n < 0 ? absl::StrCat("failed before its hello: ", ErrnoString(errno))
                                : std::string("closed before sending a whole hello"));
        }
      }
      waiting.resize(kept);
    }
    if (fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) {
      absl::MutexLock lock(&mu_);  // shut down: stop_ is set or about to be
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(100));
      continue;
    }
    if (!(fds[0].revents & POLLIN)) continue;
    // New connections: each waits (threadless) for its hello.
    for (int batch = 0; batch < 64; ++batch) {
      std::string from;
      absl::StatusOr<ScopedFd> fd = AcceptNow(listen_fd, &from);
      if (absl::IsNotFound(fd.status())) break;
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      if (!fd.ok()) {
        // A transient accept error (EMFILE...): back off briefly, retry.
        mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(100));
        break;
      }
      if (waiting.size() >= kMaxWaiting) {
        LogDrop(waiting.front().from,
                absl::StrCat("evicted to make room for newer connections: no hello after ",
                             absl::FormatDuration(absl::Now() - waiting.front().accepted)));
        waiting.pop_front();
      }
      SetReceiveLowWater(fd->get(), hello_bytes);
      waiting.push_back(Waiting{*std::move(fd), std::move(from), absl::Now()});
    }
  }
}

void TcpP2p::AddReader(ScopedFd fd, std::string from, absl::Time accepted) {
  int pending = 0, evicting = 0;
  Reader* victim = nullptr;  // the oldest unauthenticated one
  for (const auto& r : readers_) {
    if (r->done || r->authenticated) continue;
    if (r->evicted) {
      ++evicting;
      continue;
    }
    ++pending;
    if (victim == nullptr) victim = r.get();
  }
  if (evicting >= kMaxPending) {
    // The evicted ones end within microseconds; a flood faster than that is
    // refused outright rather than growing the set.
    LogDrop(from, absl::StrCat("refused: ", kMaxPending,
                               " evicted connections are still closing"));
    return;
  }
  if (pending >= kMaxPending) {
    victim->evicted = true;
    ::shutdown(victim->fd.get(), SHUT_RDWR);  // its thread fails and exits
  }
  auto reader = std::make_unique<Reader>();
  reader->fd = std::move(fd);
  reader->from = std::move(from);
  reader->accepted = accepted;
  Reader* raw = reader.get();
  try {
    raw->thread = std::thread([this, raw] {
      ReadLoop(raw);
      absl::MutexLock l(&mu_);
      raw->done = true;
    });
  } catch (const std::system_error& e) {
    LogDrop(raw->from, absl::StrCat("no thread to serve it: ", e.what()));
    return;  // the socket closes with `reader`
  }
  readers_.push_back(std::move(reader));
}

void TcpP2p::Reap() {
  std::vector<std::unique_ptr<Reader>> finished;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = readers_.begin(); it != readers_.end();) {
      if ((*it)->done) {
        finished.push_back(std::move(*it));
        it = readers_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& r : finished) r->thread.join();  // then ~Reader closes the socket
}

void TcpP2p::LogDrop(const std::string& from, absl::string_view reason) {
  ++dropped_;
  const absl::Time now = absl::Now();
  if (dropped_ > kDropLogLines && now - last_drop_log_ < kDropLogInterval) {
    ++drops_not_logged_;
    return;
  }
  const std::string not_logged =
      drops_not_logged_ == 0
          ? std::string()
          : absl::StrCat(" (and ", drops_not_logged_, " more not logged since the last line)");
  std::fprintf(stderr, "[tcp_p2p] %s: dropped connection #%lld from %s: %s%s\n",
               Context().c_str(), static_cast<long long>(dropped_), from.c_str(),
               std::string(reason).c_str(), not_logged.c_str());
  drops_not_logged_ = 0;
  if (dropped_ >= kDropLogLines) last_drop_log_ = now;
}

}  // namespace tpudist::collectives::tcp
