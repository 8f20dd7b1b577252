// An in-process Transport: W ranks that are threads of one process, with a
// mailbox per ordered (src, dst) pair. Used to test ring_algorithms.h without
// sockets, and available to other folders' tests for the same purpose.
//
// Send copies the message into the destination's mailbox and returns at once
// (unbounded buffering), so SendRecv is simply Send then Recv and can never
// deadlock. Recv blocks, with the deadline, until the next message from the
// peer arrives.
//
// Ownership: InMemoryHub owns the mailboxes and the per-rank transports;
// it must outlive every use of the transports it hands out.
// Thread-safety: the hub is thread-safe; each InMemoryTransport is
// thread-compatible (one call at a time), and distinct ranks' transports may
// be used from distinct threads concurrently, which is the point.

#ifndef TPU_DIST_COLLECTIVES_TCP_IN_MEMORY_TRANSPORT_H_
#define TPU_DIST_COLLECTIVES_TCP_IN_MEMORY_TRANSPORT_H_

#include <memory>
#include <vector>

#include "collectives/tcp/transport.h"

namespace tpudist::collectives::tcp {

class InMemoryHub;

class InMemoryTransport final : public Transport {
 public:
  int rank() const override { return rank_; }
  int size() const override;
  absl::Status Send(int peer, absl::Span<const uint8_t> data, absl::Time deadline) override;
  absl::Status Recv(int peer, absl::Span<uint8_t> data, absl::Time deadline) override;
  absl::Status SendRecv(int send_peer, absl::Span<const uint8_t> send, int recv_peer,
                        absl::Span<uint8_t> recv, absl::Time deadline) override;

 private:
  friend class InMemoryHub;
  InMemoryTransport(InMemoryHub* hub, int rank) : hub_(hub), rank_(rank) {}
  absl::Status CheckPeer(int peer, const char* op) const;

  InMemoryHub* hub_;  // Not owned.
  int rank_;
  absl::Status poisoned_;  // OK until the first failed call.
};

class InMemoryHub {
 public:
  // REQUIRES: size >= 1.
  explicit InMemoryHub(int size);
  ~InMemoryHub();
  InMemoryHub(const InMemoryHub&) = delete;
  InMemoryHub& operator=(const InMemoryHub&) = delete;

  int size() const { return size_; }
  // The transport of `rank`; owned by the hub. REQUIRES: 0 <= rank < size().
  InMemoryTransport& transport(int rank) { return *transports_[rank]; }

 private:
  friend class InMemoryTransport;
  struct Mailbox;
  Mailbox& mailbox(int src, int dst) { return *mailboxes_[src * size_ + dst]; }

  const int size_;
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;  // [src * size + dst]
  std::vector<std::unique_ptr<InMemoryTransport>> transports_;
};

}  // namespace tpudist::collectives::tcp

#endif  // TPU_DIST_COLLECTIVES_TCP_IN_MEMORY_TRANSPORT_H_
