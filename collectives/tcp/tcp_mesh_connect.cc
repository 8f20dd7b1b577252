// TcpMesh rendezvous and handshake (the data path is in tcp_mesh.cc).

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <set>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/tcp/tcp_mesh.h"
#include "tpu_runtime/hmac.h"

namespace tpudist::collectives::tcp {
namespace {

constexpr uint32_t kHelloMagic = 0x48444D54;  // "TMDH" in little-endian memory.
// 2: flags, nonce and the optional proof step (1 had neither).
constexpr uint32_t kHelloVersion = 2;
constexpr uint32_t kMaxGroupKeyBytes = 4096;
constexpr uint32_t kFlagHasSecret = 1;
constexpr size_t kNonceBytes = 32;
// Domain labels of the two proofs: a connector's proof is never valid as an
// acceptor's (no reflection), and neither is valid outside this protocol.
constexpr absl::string_view kConnectorLabel = "tpu_dist/tcp_mesh/v2/connector-proof";
constexpr absl::string_view kAcceptorLabel = "tpu_dist/tcp_mesh/v2/acceptor-proof";
// Log lines per Connect for dropped connections: the first ones, then every
// 100th (a stranger hammering the port must not flood the job's log).
constexpr int kDropLogLines = 10;
// Handshakes of accepted connections in flight at once. A connection that
// arrives when all are taken evicts the oldest (preferring one that has not
// sent a whole hello): bounds the threads a flood of strangers costs without
// ever keeping a real peer (whose hello comes with its connect) waiting.
constexpr size_t kMaxConcurrentHandshakes = 64;

// Every hello starts with these, in any version: a peer of another version
// is recognised before the rest is read.
struct HelloPrefix {
  uint32_t magic;
  uint32_t version;
};
// The rest of a version-2 hello; the group key bytes follow.
struct HelloBody {
  int32_t rank;
  int32_t size;
  uint32_t key_len;
  uint32_t flags;
  uint8_t nonce[kNonceBytes];
};

template <typename T>
absl::string_view BytesOf(const T& value) {
  return absl::string_view(reinterpret_cast<const char*>(&value), sizeof(value));
}

template <typename T>
absl::Span<uint8_t> MutableBytesOf(T& value) {
  return absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(&value), sizeof(value));
}

absl::Span<const uint8_t> SpanOf(absl::string_view s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

void WarnUnauthenticatedOnce(int rank, absl::string_view group_key, absl::string_view address) {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  std::fprintf(stderr,
               "[tcp_mesh] rank %d (group '%s'): listening on %s without a job secret: anyone "
               "who can reach this port can join the mesh; set TPU_DIST_JOB_SECRET on every "
               "rank (tpurun and tpu_dist-ray-run do)\n",
               rank, std::string(group_key).c_str(), std::string(address).c_str());
}

std::string AddressKey(absl::string_view group_key, int rank) {
  return absl::StrCat(group_key, "/tcp_mesh/addr/", rank);
}

bool IsWildcard(absl::string_view address) {
  return address.empty() || address == "0.0.0.0" || address == "::" || address == "[::]";
}

std::chrono::milliseconds Remaining(absl::Time deadline) {
  return std::chrono::milliseconds(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

}  // namespace

TcpMesh::TcpMesh(int rank, int size, std::string group_key)
    : rank_(rank), size_(size), group_key_(std::move(group_key)), peers_(size) {}

TcpMesh::~TcpMesh() = default;

absl::StatusOr<std::unique_ptr<TcpMesh>> TcpMesh::Connect(c10d::Store& store, int rank, int size,
                                                          const TcpMeshOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpMesh::Connect: invalid rank ", rank, " for size ", size));
  }
  const std::string& advertise =
      options.advertise_address.empty() ? options.bind_address : options.advertise_address;
  if (IsWildcard(advertise)) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpMesh::Connect rank ", rank, ": bind_address '", options.bind_address,
                     "' is a wildcard; set advertise_address to an address peers can dial"));
  }
  std::unique_ptr<TcpMesh> mesh(new TcpMesh(rank, size, options.group_key));
  if (size == 1) return mesh;
  const absl::Time deadline = absl::Now() + options.connect_timeout;

  absl::StatusOr<Listener> listener = ListenTcp(options.bind_address, 0, std::max(size, 128));
  if (!listener.ok()) {
    return absl::Status(listener.status().code(),
                        absl::StrCat("TcpMesh rank ", rank, ": cannot listen on ",
                                     options.bind_address, ": ", listener.status().message()));
  }
  if (options.secret.empty() && !IsLoopbackNumeric(options.bind_address)) {
    WarnUnauthenticatedOnce(rank, options.group_key, options.bind_address);
  }
  const std::string address = JoinHostPort(advertise, listener->port);
  try {
    store.set(AddressKey(options.group_key, rank),
              std::vector<uint8_t>(address.begin(), address.end()));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("TcpMesh rank ", rank, ": store.set of its address failed: ", e.what()));
  }
  if (absl::Status s = mesh->ConnectLower(store, options, deadline); !s.ok()) return s;
  if (absl::Status s = mesh->AcceptHigher(listener->fd.get(), options, deadline); !s.ok()) {
    return s;
  }
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    if (absl::Status s = ConfigureStream(mesh->peers_[p].fd.get(), options.socket_buffer_bytes);
        !s.ok()) {
      return s;
    }
  }
  return mesh;
}

absl::Status TcpMesh::ConnectLower(c10d::Store& store, const TcpMeshOptions& options,
                                   absl::Time deadline) {
  const std::string ctx = absl::StrCat("TcpMesh rank ", rank_, " (group '", group_key_, "')");
  for (int p = 0; p < rank_; ++p) {
    const std::string key = AddressKey(group_key_, p);
    std::string address;
    try {
      store.wait({key}, Remaining(deadline));
      std::vector<uint8_t> value = store.get(key);
      address.assign(value.begin(), value.end());
    } catch (const std::exception& e) {
      return absl::DeadlineExceededError(
          absl::StrCat(ctx, ": peer rank ", p, " never published its address (store key '", key,
                       "') within connect_timeout ", absl::FormatDuration(options.connect_timeout),
                       "; did it start? store said: ", e.what()));
    }
    absl::StatusOr<std::pair<std::string, int>> host_port = SplitHostPort(address);
    if (!host_port.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ctx, ": peer rank ", p, " published ", host_port.status().message()));
    }
    absl::StatusOr<ScopedFd> fd = ConnectUntil(host_port->first, host_port->second, deadline);
    if (!fd.ok()) {
      return absl::Status(fd.status().code(),
                          absl::StrCat(ctx, ": connecting to peer rank ", p, " at ", address, ": ",
                                       fd.status().message()));
    }
    int peer_rank = -1;
    bool authenticated = false;
    if (absl::Status s = Handshake(fd->get(), p, absl::StrCat("peer rank ", p, " at ", address),
                                   options.secret, deadline, &peer_rank, &authenticated);
        !s.ok()) {
      return s;
    }
    peers_[p].fd = std::move(*fd);
  }
  return absl::OkStatus();
}

// An accepted connection whose handshake runs on its own thread, so that a
// stranger that stays silent (or trickles bytes) holds only its own slot,
// never the real peers queued behind it.
struct TcpMesh::PendingHandshake {
  ScopedFd fd;
  std::string from;
  std::thread thread;
  // Written by `thread` before it signals, read after join().
  absl::Status status;
  int peer_rank = -1;
  bool authenticated = false;
  absl::Time accepted;
  std::atomic<bool> got_hello{false};  // set by `thread`
  bool evicted = false;                // shut down to make room
  std::atomic<bool> done{false};
};

absl::Status TcpMesh::AcceptHigher(int listen_fd, const TcpMeshOptions& options,
                                   absl::Time deadline) {
  const std::string ctx = absl::StrCat("TcpMesh rank ", rank_, " (group '", group_key_, "')");
  std::set<int> missing;
  for (int p = rank_ + 1; p < size_; ++p) missing.insert(p);
  // Handshake threads write 1 here when they finish: the loop below sleeps in
  // poll() on it and the listener, never spins.
  ScopedFd wake(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake.valid()) {
    return absl::InternalError(absl::StrCat(ctx, ": eventfd: ", ErrnoString(errno)));
  }
  std::vector<std::unique_ptr<PendingHandshake>> pending;
  // Whatever happens, no handshake thread outlives this call: shut their
  // sockets down (their reads and writes return at once) and join them.
  struct JoinAll {
    std::vector<std::unique_ptr<PendingHandshake>>* pending;
    ~JoinAll() {
      for (auto& p : *pending) {
        if (p->fd.valid()) shutdown(p->fd.get(), SHUT_RDWR);
        if (p->thread.joinable()) p->thread.join();
      }
    }
  } join_all{&pending};

  int dropped = 0;
  std::string last_drop, last_drop_from;
  auto drop = [&](const std::string& from, std::string reason) {
    ++dropped;
    last_drop = std::move(reason);
    last_drop_from = from;
    if (dropped <= kDropLogLines || dropped % 100 == 0) {
      std::fprintf(stderr, "[tcp_mesh] %s: dropped connection #%d from %s: %s\n", ctx.c_str(),
                   dropped, from.c_str(), last_drop.c_str());
    }
  };

  while (!missing.empty()) {
    // 1. Collect finished handshakes.
    for (size_t i = 0; i < pending.size();) {
      PendingHandshake& p = *pending[i];
      if (!p.done.load(std::memory_order_acquire)) {
        ++i;
        continue;
      }
      p.thread.join();
      if (p.evicted) {
        // Shut down to make room while it had not authenticated (whatever
        // its handshake made of that).
        drop(p.from,
             absl::StrCat("evicted to make room for newer connections: not authenticated after ",
                          absl::FormatDuration(absl::Now() - p.accepted)));
      } else if (!p.status.ok()) {
        // A member of the job that disagrees with us is an error; anyone
        // else (a port scanner, another job, a wrong secret) is dropped and
        // we keep waiting for the real peer.
        if (p.authenticated) return p.status;
        absl::string_view reason = p.status.message();
        if (size_t at = reason.find(p.from + ": "); at != absl::string_view::npos) {
          reason.remove_prefix(at + p.from.size() + 2);  // ctx is in the log line already
        }
        drop(p.from, absl::IsDeadlineExceeded(p.status)
                         ? absl::StrCat("no complete handshake within handshake_timeout ",
                                        absl::FormatDuration(options.handshake_timeout))
                         : std::string(reason));
      } else if (missing.erase(p.peer_rank) == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            ctx, ": handshake from rank ", p.peer_rank, " at ", p.from,
            " which is not an expected higher rank (duplicate rank or wrong connect order)"));
      } else {
        peers_[p.peer_rank].fd = std::move(p.fd);
      }
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (missing.empty()) break;

    // 2. Wait for a connection or a finished handshake. New connections
    //    wait in the listen backlog only while as many evicted handshakes
    //    as the cap are still ending (microseconds).
    size_t evicting = 0;
    for (const auto& p : pending) evicting += p->evicted ? 1 : 0;
    const bool at_cap = evicting >= kMaxConcurrentHandshakes;
    pollfd fds[2] = {{wake.get(), POLLIN, 0},
                     {listen_fd, static_cast<short>(at_cap ? 0 : POLLIN), 0}};
    const int n = poll(fds, 2, PollTimeoutMs(deadline));
    if (n < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat(ctx, ": poll: ", ErrnoString(errno)));
    }
    if (n == 0 && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          ctx, ": peer rank(s) ", absl::StrJoin(missing, ","),
          " did not connect within connect_timeout ", absl::FormatDuration(options.connect_timeout),
          dropped == 0 ? ""
                       : absl::StrCat("; meanwhile ", dropped,
                                      " connection(s) that did not authenticate were dropped, "
                                      "the last from ",
                                      last_drop_from, ": ", last_drop)));
    }
    if (fds[0].revents & POLLIN) {
      uint64_t count = 0;
      (void)!read(wake.get(), &count, sizeof(count));
    }
    if (!(fds[1].revents & POLLIN)) continue;
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
        continue;
      }
      return absl::UnavailableError(absl::StrCat(ctx, ": accept: ", ErrnoString(errno)));
    }
    if (pending.size() - evicting >= kMaxConcurrentHandshakes) {
      PendingHandshake* victim = nullptr;  // the oldest without a hello, else the oldest
      for (auto& q : pending) {
        if (q->evicted || q->done.load(std::memory_order_acquire)) continue;
        if (victim == nullptr || (victim->got_hello.load() && !q->got_hello.load())) {
          victim = q.get();
        }
      }
      if (victim != nullptr) {
        victim->evicted = true;
        shutdown(victim->fd.get(), SHUT_RDWR);  // its handshake fails at once
      }
    }
    auto p = std::make_unique<PendingHandshake>();
    p->fd.Reset(fd);
    p->from = PeerAddress(fd);
    p->accepted = absl::Now();
    const absl::Time handshake_deadline =
        std::min(deadline, absl::Now() + options.handshake_timeout);
    PendingHandshake* raw = p.get();
    const int wake_fd = wake.get();
    raw->thread = std::thread([this, raw, wake_fd, handshake_deadline, &options] {
      raw->status =
          Handshake(raw->fd.get(), -1, absl::StrCat("a connection from ", raw->from),
                    options.secret, handshake_deadline, &raw->peer_rank, &raw->authenticated,
                    &raw->got_hello);
      raw->done.store(true, std::memory_order_release);
      const uint64_t one = 1;
      (void)!write(wake_fd, &one, sizeof(one));
    });
    pending.push_back(std::move(p));
  }
  return absl::OkStatus();
}

absl::Status TcpMesh::Handshake(int fd, int expected_peer, absl::string_view where,
                                const std::string& secret, absl::Time deadline, int* peer_rank,
                                bool* authenticated, std::atomic<bool>* got_hello) {
  *authenticated = false;
  const bool connector = expected_peer >= 0;
  const std::string ctx = absl::StrCat("TcpMesh rank ", rank_, " (group '", group_key_, "', size ",
                                       size_, ") handshake with ", where);
  absl::StatusOr<std::string> nonce = tpu_runtime::SecureRandomBytes(kNonceBytes);
  if (!nonce.ok()) return nonce.status();
  const HelloPrefix my_prefix{kHelloMagic, kHelloVersion};
  HelloBody my_body{rank_,
                    size_,
                    static_cast<uint32_t>(group_key_.size()),
                    secret.empty() ? 0u : kFlagHasSecret,
                    {}};
  std::memcpy(my_body.nonce, nonce->data(), kNonceBytes);
  const std::string mine = absl::StrCat(BytesOf(my_prefix), BytesOf(my_body), group_key_);
  if (absl::Status s = WriteAll(fd, SpanOf(mine), deadline); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(ctx, ": sending hello: ", s.message()));
  }

  HelloPrefix prefix{};
  if (absl::Status s = ReadAll(fd, MutableBytesOf(prefix), deadline); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(ctx, ": reading hello: ", s.message(),
                                               " (the peer may have rejected our hello)"));
  }
  if (prefix.magic != kHelloMagic) {
    return absl::FailedPreconditionError(
        absl::StrCat(ctx, ": bad magic 0x", absl::Hex(prefix.magic),
                     ", the peer is not a TcpMesh (or has a different byte order)"));
  }
  if (prefix.version != kHelloVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(ctx, ": protocol version ", prefix.version, " != ours ", kHelloVersion));
  }
  HelloBody body{};
  if (absl::Status s = ReadAll(fd, MutableBytesOf(body), deadline); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(ctx, ": reading hello: ", s.message()));
  }
  if (body.key_len > kMaxGroupKeyBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(ctx, ": group key length ", body.key_len, " is too long"));
  }
  std::string their_key(body.key_len, '\0');
  if (absl::Status s = ReadAll(
          fd, absl::MakeSpan(reinterpret_cast<uint8_t*>(their_key.data()), their_key.size()),
          deadline);
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(ctx, ": reading group key: ", s.message()));
  }
  if (got_hello != nullptr) got_hello->store(true);

  const bool they_have_secret = (body.flags & kFlagHasSecret) != 0;
  if (secret.empty() && they_have_secret) {
    return absl::UnauthenticatedError(absl::StrCat(
        ctx, ": the peer (claiming rank ", body.rank,
        ") authenticates with a job secret and this rank has none; give every rank the same "
        "TPU_DIST_JOB_SECRET"));
  }
  if (!secret.empty()) {
    if (!they_have_secret) {
      return absl::UnauthenticatedError(absl::StrCat(
          ctx, ": the peer (claiming rank ", body.rank,
          ") presented no job secret and this rank requires one; give every rank the same "
          "TPU_DIST_JOB_SECRET"));
    }
    if (std::memcmp(body.nonce, my_body.nonce, kNonceBytes) == 0) {
      return absl::UnauthenticatedError(
          absl::StrCat(ctx, ": the peer echoed our nonce (a reflected hello)"));
    }
    const std::string theirs = absl::StrCat(BytesOf(prefix), BytesOf(body), their_key);
    const tpu_runtime::Mac my_proof = tpu_runtime::HmacSha256(
        secret, {connector ? kConnectorLabel : kAcceptorLabel, mine, theirs});
    if (absl::Status s = WriteAll(fd, my_proof, deadline); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(ctx, ": sending proof: ", s.message()));
    }
    tpu_runtime::Mac their_proof{};
    if (absl::Status s = ReadAll(fd, absl::MakeSpan(their_proof), deadline); !s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat(ctx, ": reading proof: ", s.message(),
                                 " (the peer may have rejected ours: a different job secret?)"));
    }
    const tpu_runtime::Mac expected = tpu_runtime::HmacSha256(
        secret, {connector ? kAcceptorLabel : kConnectorLabel, theirs, mine});
    if (!tpu_runtime::MacEqual(expected, their_proof)) {
      return absl::UnauthenticatedError(absl::StrCat(
          ctx, ": the peer (claiming rank ", body.rank,
          ") failed to prove the job secret: it was given a different TPU_DIST_JOB_SECRET, or "
          "is not part of this job"));
    }
  }
  // From here on the peer is one of the job's ranks (or, without a secret,
  // trusted as one): disagreements are configuration errors.
  *authenticated = true;

  if (their_key != group_key_) {
    return absl::FailedPreconditionError(
        absl::StrCat(ctx, ": peer rank ", body.rank, " is in group '", their_key, "', not ours"));
  }
  if (body.size != size_) {
    return absl::FailedPreconditionError(absl::StrCat(
        ctx, ": peer rank ", body.rank, " has world size ", body.size, ", ours is ", size_));
  }
  const bool rank_ok =
      connector ? body.rank == expected_peer : body.rank > rank_ && body.rank < size_;
  if (!rank_ok) {
    return absl::FailedPreconditionError(
        absl::StrCat(ctx, ": peer claims rank ", body.rank, ", expected ",
                     connector ? absl::StrCat(expected_peer)
                               : absl::StrCat("a rank in (", rank_, ", ", size_, ")")));
  }
  *peer_rank = body.rank;
  return absl::OkStatus();
}

}  // namespace tpudist::collectives::tcp
