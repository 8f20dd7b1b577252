// TcpMesh rendezvous and handshake (the data path is in tcp_mesh.cc).

#include <chrono>
#include <cstring>
#include <exception>
#include <set>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/tcp/tcp_mesh.h"

namespace tpudist::collectives::tcp {
namespace {

constexpr uint32_t kHelloMagic = 0x48444D54;  // "TMDH" in little-endian memory.
constexpr uint32_t kHelloVersion = 1;
constexpr uint32_t kMaxGroupKeyBytes = 4096;

// Fixed part of the hello; the group key bytes follow.
struct HelloHeader {
  uint32_t magic;
  uint32_t version;
  int32_t rank;
  int32_t size;
  uint32_t key_len;
};

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

  absl::StatusOr<Listener> listener = ListenTcp(options.bind_address, 0, std::max(size, 16));
  if (!listener.ok()) {
    return absl::Status(listener.status().code(),
                        absl::StrCat("TcpMesh rank ", rank, ": cannot listen on ",
                                     options.bind_address, ": ", listener.status().message()));
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
  if (absl::Status s = mesh->AcceptHigher(listener->fd.get(), deadline); !s.ok()) return s;
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
    if (absl::Status s = Handshake(fd->get(), p, address, deadline, &peer_rank); !s.ok()) return s;
    peers_[p].fd = std::move(*fd);
  }
  return absl::OkStatus();
}

absl::Status TcpMesh::AcceptHigher(int listen_fd, absl::Time deadline) {
  std::set<int> missing;
  for (int p = rank_ + 1; p < size_; ++p) missing.insert(p);
  while (!missing.empty()) {
    absl::StatusOr<ScopedFd> fd = AcceptUntil(listen_fd, deadline);
    if (!fd.ok()) {
      return absl::Status(
          fd.status().code(),
          absl::StrCat("TcpMesh rank ", rank_, " (group '", group_key_, "'): peer rank(s) ",
                       absl::StrJoin(missing, ","),
                       " did not connect within connect_timeout: ", fd.status().message()));
    }
    int peer_rank = -1;
    if (absl::Status s = Handshake(fd->get(), -1, "an accepted connection", deadline, &peer_rank);
        !s.ok()) {
      return s;
    }
    if (missing.erase(peer_rank) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "TcpMesh rank ", rank_, " (group '", group_key_, "'): handshake from rank ", peer_rank,
          " which is not an expected higher rank (duplicate rank or wrong connect order)"));
    }
    peers_[peer_rank].fd = std::move(*fd);
  }
  return absl::OkStatus();
}

absl::Status TcpMesh::Handshake(int fd, int expected_peer, absl::string_view where,
                                absl::Time deadline, int* peer_rank) {
  const std::string ctx = absl::StrCat("TcpMesh rank ", rank_, " (group '", group_key_, "', size ",
                                       size_, ") handshake with ", where);
  HelloHeader mine{kHelloMagic, kHelloVersion, rank_, size_,
                   static_cast<uint32_t>(group_key_.size())};
  std::vector<uint8_t> out(sizeof(mine) + group_key_.size());
  std::memcpy(out.data(), &mine, sizeof(mine));
  std::memcpy(out.data() + sizeof(mine), group_key_.data(), group_key_.size());
  if (absl::Status s = WriteAll(fd, out, deadline); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(ctx, ": sending hello: ", s.message()));
  }
  HelloHeader theirs{};
  absl::Span<uint8_t> theirs_bytes(reinterpret_cast<uint8_t*>(&theirs), sizeof(theirs));
  if (absl::Status s = ReadAll(fd, theirs_bytes, deadline); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(ctx, ": reading hello: ", s.message(),
                                               " (the peer may have rejected our hello)"));
  }
  if (theirs.magic != kHelloMagic) {
    return absl::FailedPreconditionError(
        absl::StrCat(ctx, ": bad magic 0x", absl::Hex(theirs.magic),
                     ", the peer is not a TcpMesh (or has a different byte order)"));
  }
  if (theirs.version != kHelloVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(ctx, ": protocol version ", theirs.version, " != ours ", kHelloVersion));
  }
  if (theirs.key_len > kMaxGroupKeyBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(ctx, ": group key length ", theirs.key_len, " is too long"));
  }
  std::string their_key(theirs.key_len, '\0');
  if (absl::Status s = ReadAll(
          fd, absl::MakeSpan(reinterpret_cast<uint8_t*>(their_key.data()), their_key.size()),
          deadline);
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(ctx, ": reading group key: ", s.message()));
  }
  if (their_key != group_key_) {
    return absl::FailedPreconditionError(
        absl::StrCat(ctx, ": peer rank ", theirs.rank, " is in group '", their_key, "', not ours"));
  }
  if (theirs.size != size_) {
    return absl::FailedPreconditionError(absl::StrCat(
        ctx, ": peer rank ", theirs.rank, " has world size ", theirs.size, ", ours is ", size_));
  }
  const bool rank_ok = expected_peer >= 0 ? theirs.rank == expected_peer
                                          : theirs.rank > rank_ && theirs.rank < size_;
  if (!rank_ok) {
    return absl::FailedPreconditionError(
        absl::StrCat(ctx, ": peer claims rank ", theirs.rank, ", expected ",
                     expected_peer >= 0 ? absl::StrCat(expected_peer)
                                        : absl::StrCat("a rank in (", rank_, ", ", size_, ")")));
  }
  *peer_rank = theirs.rank;
  return absl::OkStatus();
}

}  // namespace tpudist::collectives::tcp
