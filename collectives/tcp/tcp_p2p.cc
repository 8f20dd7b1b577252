// TcpP2p: lazy per-pair connections, the accept/reader threads and the
// per-(peer, tag) queues. See tcp_p2p.h.
#include "collectives/tcp/tcp_p2p.h"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/strings/str_cat.h"
#include "tpu_runtime/hmac.h"

namespace tpudist::collectives::tcp {
namespace {

constexpr uint32_t kHelloMagic = 0x50325054;  // "TP2P"
constexpr uint32_t kHelloVersion = 1;
constexpr uint32_t kFrameMagic = 0x4D503254;  // "T2PM"
constexpr uint32_t kFlagHasSecret = 1;
constexpr size_t kNonceBytes = 32;
constexpr uint32_t kMaxGroupKeyBytes = 4096;
// Listen backlog: a burst of strangers does not crowd a real peer's SYN out.
constexpr int kListenBacklog = 128;
constexpr size_t kCoalesceBytes = 64 << 10;  // header + payload in one write below this
constexpr absl::string_view kConnectorLabel = "tpu_dist/tcp_p2p/v1/connector-proof";
constexpr absl::string_view kAcceptorLabel = "tpu_dist/tcp_p2p/v1/acceptor-proof";

struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t rank;
  int32_t peer;  // the rank the sender expects on the other side; -1 = any
  int32_t size;
  uint32_t flags;
  uint32_t key_len;
  uint8_t nonce[kNonceBytes];
};

struct FrameHeader {
  uint32_t magic;
  int32_t tag;
  uint64_t bytes;
};
static_assert(sizeof(FrameHeader) == 16);

template <typename T>
absl::Span<const uint8_t> ConstBytes(const T& v) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(&v), sizeof(v));
}
template <typename T>
absl::Span<uint8_t> MutBytes(T& v) {
  return absl::MakeSpan(reinterpret_cast<uint8_t*>(&v), sizeof(v));
}
absl::string_view View(absl::Span<const uint8_t> s) {
  return absl::string_view(reinterpret_cast<const char*>(s.data()), s.size());
}

std::string AddressKey(int rank) { return absl::StrCat("p2p/addr/", rank); }

}  // namespace

absl::StatusOr<std::unique_ptr<TcpP2p>> TcpP2p::Start(c10d::Store& store, int rank, int size,
                                                      const TcpP2pOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("TcpP2p: bad rank ", rank, " of ", size));
  }
  absl::StatusOr<Listener> listener = ListenTcp(options.bind_address, 0, std::max(size, kListenBacklog));
  if (!listener.ok()) {
    return absl::Status(listener.status().code(),
                        absl::StrCat("TcpP2p rank ", rank, ": cannot listen on ",
                                     options.bind_address, ": ", listener.status().message()));
  }
  const std::string& advertise =
      options.advertise_address.empty() ? options.bind_address : options.advertise_address;
  const std::string address = JoinHostPort(advertise, listener->port);
  try {
    store.set(AddressKey(rank), std::vector<uint8_t>(address.begin(), address.end()));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("TcpP2p rank ", rank, ": publishing its address failed: ", e.what()));
  }
  std::unique_ptr<TcpP2p> p2p(new TcpP2p(rank, size, options, *std::move(listener)));
  p2p->acceptor_ = std::thread([raw = p2p.get()] { raw->AcceptLoop(); });
  return p2p;
}

TcpP2p::TcpP2p(int rank, int size, TcpP2pOptions options, Listener listener)
    : rank_(rank), size_(size), options_(std::move(options)), listener_(std::move(listener)),
      in_(size) {
  for (int r = 0; r < size; ++r) out_.push_back(std::make_unique<OutLink>());
}

TcpP2p::~TcpP2p() {
  std::list<std::unique_ptr<Reader>> readers;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (const auto& r : readers_) ::shutdown(r->fd.get(), SHUT_RDWR);
  }
  ::shutdown(listener_.fd.get(), SHUT_RDWR);  // wakes the accept poll
  if (acceptor_.joinable()) acceptor_.join();
  {
    absl::MutexLock lock(&mu_);
    readers.swap(readers_);
  }
  for (const auto& r : readers) r->thread.join();
  for (auto& link : out_) {
    absl::MutexLock lock(&link->mu);
    if (link->fd.valid()) ::shutdown(link->fd.get(), SHUT_RDWR);
  }
}

std::string TcpP2p::Context() const {
  return absl::StrCat("p2p rank ", rank_, " (group '", options_.group_key, "')");
}

void TcpP2p::Abort(const absl::Status& cause) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_.ok()) aborted_ = cause.ok() ? absl::AbortedError("aborted") : cause;
    for (const auto& r : readers_) ::shutdown(r->fd.get(), SHUT_RDWR);
    cv_.SignalAll();
  }
  for (auto& link : out_) {
    // Not under link->mu: a blocked Send holds it (see OutLink::abort_fd).
    // The write() it is blocked in fails at once with EPIPE.
    const int fd = link->abort_fd.load(std::memory_order_acquire);
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }
}

absl::Status TcpP2p::Connect(c10d::Store& store, int dst, OutLink& link, absl::Time deadline) {
  const std::string key = AddressKey(dst);
  std::string address;
  try {
    const int64_t ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now()));
    store.wait({key}, std::chrono::milliseconds(ms));
    const std::vector<uint8_t> v = store.get(key);
    address.assign(v.begin(), v.end());
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(absl::StrCat(
        "peer rank ", dst, " never published its p2p address: ", e.what()));
  }
  absl::StatusOr<std::pair<std::string, int>> hp = SplitHostPort(address);
  if (!hp.ok()) return hp.status();
  absl::StatusOr<ScopedFd> fd = ConnectUntil(hp->first, hp->second, deadline);
  if (!fd.ok()) {
    return absl::Status(fd.status().code(), absl::StrCat("connecting to peer rank ", dst, " at ",
                                                         address, ": ", fd.status().message()));
  }
  if (absl::Status s = ConfigureStream(fd->get(), 0); !s.ok()) return s;
  int peer = -1;
  if (absl::Status s = Handshake(fd->get(), dst, deadline, &peer); !s.ok()) return s;
  link.fd = *std::move(fd);
  link.abort_fd.store(link.fd.get(), std::memory_order_release);
  return absl::OkStatus();
}

absl::Status TcpP2p::Send(c10d::Store& store, int dst, int tag, absl::Span<const uint8_t> data,
                          absl::Time deadline) {
  if (dst < 0 || dst >= size_ || dst == rank_) {
    return absl::InvalidArgumentError(absl::StrCat(Context(), ": send to invalid rank ", dst));
  }
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) return aborted_;
  }
  OutLink& link = *out_[dst];
  absl::MutexLock lock(&link.mu);
  if (!link.error.ok()) return link.error;
  const absl::Time start = absl::Now();
  absl::Status s;
  if (!link.fd.valid()) s = Connect(store, dst, link, deadline);
  if (s.ok()) {
    const FrameHeader h{kFrameMagic, tag, data.size()};
    if (data.size() <= kCoalesceBytes) {
      std::vector<uint8_t> frame(sizeof(h) + data.size());
      std::memcpy(frame.data(), &h, sizeof(h));
      if (!data.empty()) std::memcpy(frame.data() + sizeof(h), data.data(), data.size());
      s = WriteAll(link.fd.get(), frame, deadline);
    } else {
      s = WriteAll(link.fd.get(), ConstBytes(h), deadline);
      if (s.ok()) s = WriteAll(link.fd.get(), data, deadline);
    }
  }
  if (s.ok()) return s;
  {
    // Lock order: link.mu, then mu_ (nothing takes them the other way).
    absl::MutexLock aborted_lock(&mu_);
    if (!aborted_.ok()) {
      s = absl::Status(aborted_.code(), absl::StrCat("aborted: ", aborted_.message()));
    }
  }
  link.error = absl::Status(
      s.code(), absl::StrCat(Context(), ": send to peer rank ", dst, " (tag ", tag, ", ",
                             data.size(), " bytes) failed after ",
                             absl::FormatDuration(absl::Now() - start), ": ", s.message()));
  if (link.fd.valid()) ::shutdown(link.fd.get(), SHUT_RDWR);
  return link.error;
}

absl::Status TcpP2p::Recv(int src, int tag, absl::Span<uint8_t> data, absl::Time deadline) {
  if (src < 0 || src >= size_ || src == rank_) {
    return absl::InvalidArgumentError(absl::StrCat(Context(), ": recv from invalid rank ", src));
  }
  const absl::Time start = absl::Now();
  const std::string what =
      absl::StrCat(Context(), ": recv from peer rank ", src, " (tag ", tag, ", ", data.size(),
                   " bytes)");
  Message m;
  Posted posted;
  posted.tag = tag;
  posted.data = data;
  posted.deadline = deadline;
  {
    absl::MutexLock lock(&mu_);
    InPeer& in = in_[src];
    if (in.posted == nullptr) in.posted = &posted;
    auto unpost = [&] {
      if (in.posted == &posted) in.posted = nullptr;
    };
    while (true) {
      if (posted.state == Posted::kDone) {
        unpost();
        if (!posted.status.ok()) return absl::Status(posted.status.code(), absl::StrCat(
            what, ": reading the message: ", posted.status.message()));
        return absl::OkStatus();
      }
      // Once the reader fills our buffer we must wait for it to finish (its
      // read is bounded by our deadline, and Abort/close end it too).
      if (posted.state != Posted::kFilling) {
        if (std::optional<absl::Status> r = in.Look(
                tag, aborted_, start, deadline, what,
                in.connected ? "(connected; no message with this tag)"
                             : "(the peer never connected: has it sent anything?)",
                &m)) {
          unpost();
          if (!r->ok()) return *r;
          break;
        }
      }
      cv_.WaitWithDeadline(&mu_, deadline);
    }
  }
  if (m.size != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(Context(), ": recv from peer rank ", src,
                                                   " (tag ", tag, "): expected ", data.size(),
                                                   " bytes, the sender sent ", m.size));
  }
  if (m.size > 0) std::memcpy(data.data(), m.bytes.get(), m.size);
  return absl::OkStatus();
}

void TcpP2p::ReadLoop(Reader* reader) {
  const int fd = reader->fd.get();
  const std::string& from = reader->from;
  int src = -1;
  absl::Status hs = ConfigureStream(fd, 0);
  if (hs.ok()) {
    hs = Handshake(fd, -1, reader->accepted + options_.handshake_timeout, &src);
  }
  {
    absl::MutexLock lock(&mu_);
    if (reader->evicted) {
      hs = absl::ResourceExhaustedError(
          absl::StrCat("evicted to make room for newer connections: not authenticated after ",
                       absl::FormatDuration(absl::Now() - reader->accepted)));
    } else if (absl::IsDeadlineExceeded(hs)) {
      hs = absl::DeadlineExceededError(
          absl::StrCat("no complete handshake within handshake_timeout ",
                       absl::FormatDuration(options_.handshake_timeout)));
    } else if (hs.ok() && (in_[src].connected || !in_[src].closed.ok())) {
      hs = absl::AlreadyExistsError(absl::StrCat("a second connection claiming rank ", src));
    }
    if (!hs.ok()) {
      if (!stop_) LogDrop(from, hs.message());
      return;
    }
    reader->authenticated = true;
    in_[src].connected = true;
  }
  absl::Status s;
  while (true) {
    FrameHeader h{};
    s = ReadAll(fd, MutBytes(h), absl::InfiniteFuture());
    if (!s.ok()) break;
    if (h.magic != kFrameMagic) {
      s = absl::DataLossError(absl::StrCat("bad frame magic 0x", absl::Hex(h.magic)));
      break;
    }
    Posted* direct = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (aborted_.ok()) direct = in_[src].ClaimPosted(h.tag, h.bytes);
    }
    if (direct != nullptr) {
      s = ReadAll(fd, direct->data, direct->deadline);
      absl::MutexLock lock(&mu_);
      direct->status = s;
      direct->state = Posted::kDone;
      cv_.SignalAll();
      if (!s.ok()) break;  // mid-frame: the stream cannot be resynchronised
      continue;
    }
    Message m;
    m.size = h.bytes;
    if (m.size > 0) {
      m.bytes.reset(new uint8_t[m.size]);
      s = ReadAll(fd, absl::MakeSpan(m.bytes.get(), m.size), absl::InfiniteFuture());
      if (!s.ok()) break;
    }
    absl::MutexLock lock(&mu_);
    in_[src].queues[h.tag].push_back(std::move(m));
    cv_.SignalAll();
  }
  absl::MutexLock lock(&mu_);
  in_[src].closed = absl::UnavailableError(absl::StrCat(
      "the connection from peer rank ", src, " (", from, ") closed: ", s.message(),
      " (did rank ", src, " exit, crash or destroy its group?)"));
  cv_.SignalAll();
}

size_t TcpP2p::HelloBytes() { return sizeof(Hello); }

bool TcpP2p::IsHello(const uint8_t* bytes) {
  Hello h;
  std::memcpy(&h, bytes, sizeof(h));
  return h.magic == kHelloMagic && h.version == kHelloVersion && h.key_len <= kMaxGroupKeyBytes;
}

absl::Status TcpP2p::Handshake(int fd, int expected_peer, absl::Time deadline, int* peer_rank) {
  const bool connector = expected_peer >= 0;
  const std::string& secret = options_.secret;
  const std::string& key = options_.group_key;
  const std::string ctx =
      absl::StrCat(Context(), connector ? absl::StrCat(": handshake with peer rank ", expected_peer)
                                        : std::string(": handshake with an accepted connection"));
  absl::StatusOr<std::string> nonce = tpu_runtime::SecureRandomBytes(kNonceBytes);
  if (!nonce.ok()) return nonce.status();
  Hello mine{kHelloMagic, kHelloVersion, rank_, expected_peer, size_,
             secret.empty() ? 0u : kFlagHasSecret, static_cast<uint32_t>(key.size()), {}};
  std::memcpy(mine.nonce, nonce->data(), kNonceBytes);
  const std::string my_bytes = absl::StrCat(View(ConstBytes(mine)), key);
  absl::Status s = WriteAll(
      fd, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(my_bytes.data()), my_bytes.size()),
      deadline);
  Hello theirs{};
  if (s.ok()) s = ReadAll(fd, MutBytes(theirs), deadline);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(ctx, ": hello: ", s.message()));
  if (theirs.magic != kHelloMagic || theirs.version != kHelloVersion ||
      theirs.key_len > kMaxGroupKeyBytes) {
    return absl::FailedPreconditionError(absl::StrCat(ctx, ": not a tpu_dist p2p peer (v1)"));
  }
  std::string their_key(theirs.key_len, '\0');
  s = ReadAll(fd, absl::MakeSpan(reinterpret_cast<uint8_t*>(their_key.data()), their_key.size()),
              deadline);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(ctx, ": group key: ", s.message()));
  const bool they_have_secret = (theirs.flags & kFlagHasSecret) != 0;
  if (they_have_secret != !secret.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        ctx, ": one side has a job secret and the other has none; give every rank the same "
             "TPU_DIST_JOB_SECRET"));
  }
  if (!secret.empty()) {
    if (std::memcmp(theirs.nonce, mine.nonce, kNonceBytes) == 0) {
      return absl::UnauthenticatedError(absl::StrCat(ctx, ": the peer echoed our nonce"));
    }
    const std::string their_bytes = absl::StrCat(View(ConstBytes(theirs)), their_key);
    const tpu_runtime::Mac proof = tpu_runtime::HmacSha256(
        secret, {connector ? kConnectorLabel : kAcceptorLabel, my_bytes, their_bytes});
    s = WriteAll(fd, proof, deadline);
    tpu_runtime::Mac their_proof{};
    if (s.ok()) s = ReadAll(fd, absl::MakeSpan(their_proof), deadline);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(ctx, ": proof: ", s.message()));
    const tpu_runtime::Mac expected = tpu_runtime::HmacSha256(
        secret, {connector ? kAcceptorLabel : kConnectorLabel, their_bytes, my_bytes});
    if (!tpu_runtime::MacEqual(expected, their_proof)) {
      return absl::UnauthenticatedError(absl::StrCat(
          ctx, ": the peer (claiming rank ", theirs.rank,
          ") failed to prove the job secret (a different TPU_DIST_JOB_SECRET?)"));
    }
  }
  const bool rank_ok = connector ? theirs.rank == expected_peer
                                 : theirs.rank >= 0 && theirs.rank < size_ && theirs.rank != rank_;
  if (their_key != key || theirs.size != size_ || theirs.peer != (connector ? -1 : rank_) ||
      !rank_ok) {
    return absl::FailedPreconditionError(absl::StrCat(
        ctx, ": peer claims rank ", theirs.rank, " of ", theirs.size, " in group '", their_key,
        "' expecting rank ", theirs.peer, "; this is rank ", rank_, " of ", size_, " in '", key,
        "'"));
  }
  *peer_rank = theirs.rank;
  return absl::OkStatus();
}

}  // namespace tpudist::collectives::tcp
