#include "collectives/tcp/in_memory_transport.h"

#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace tpudist::collectives::tcp {

struct InMemoryHub::Mailbox {
  absl::Mutex mu;
  std::deque<std::vector<uint8_t>> messages ABSL_GUARDED_BY(mu);
};

InMemoryHub::InMemoryHub(int size) : size_(size) {
  mailboxes_.reserve(static_cast<size_t>(size) * size);
  for (int i = 0; i < size * size; ++i) mailboxes_.push_back(std::make_unique<Mailbox>());
  for (int r = 0; r < size; ++r) {
    transports_.push_back(std::unique_ptr<InMemoryTransport>(new InMemoryTransport(this, r)));
  }
}

InMemoryHub::~InMemoryHub() = default;

int InMemoryTransport::size() const { return hub_->size(); }

absl::Status InMemoryTransport::CheckPeer(int peer, const char* op) const {
  if (!poisoned_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "in-memory rank ", rank_, ": ", op, " on a poisoned transport: ", poisoned_.message()));
  }
  if (peer < 0 || peer >= size() || peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat("in-memory rank ", rank_, ": ", op, " with invalid peer ", peer));
  }
  return absl::OkStatus();
}

absl::Status InMemoryTransport::Send(int peer, absl::Span<const uint8_t> data,
                                     absl::Time /*deadline*/) {
  if (absl::Status s = CheckPeer(peer, "Send"); !s.ok()) return s;
  InMemoryHub::Mailbox& box = hub_->mailbox(rank_, peer);
  absl::MutexLock lock(&box.mu);
  box.messages.emplace_back(data.begin(), data.end());
  return absl::OkStatus();
}

absl::Status InMemoryTransport::Recv(int peer, absl::Span<uint8_t> data, absl::Time deadline) {
  if (absl::Status s = CheckPeer(peer, "Recv"); !s.ok()) return s;
  InMemoryHub::Mailbox& box = hub_->mailbox(peer, rank_);
  absl::MutexLock lock(&box.mu);
  auto ready = [&box]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(box.mu) { return !box.messages.empty(); };
  if (!box.mu.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return poisoned_ = absl::DeadlineExceededError(
               absl::StrCat("in-memory rank ", rank_, ": Recv of ", data.size(),
                            " bytes from peer ", peer, " timed out"));
  }
  std::vector<uint8_t> message = std::move(box.messages.front());
  box.messages.pop_front();
  if (message.size() != data.size()) {
    return poisoned_ = absl::InvalidArgumentError(
               absl::StrCat("in-memory rank ", rank_, ": Recv from peer ", peer, " expected ",
                            data.size(), " bytes but the message has ", message.size()));
  }
  if (!message.empty()) std::memcpy(data.data(), message.data(), message.size());
  return absl::OkStatus();
}

absl::Status InMemoryTransport::SendRecv(int send_peer, absl::Span<const uint8_t> send,
                                         int recv_peer, absl::Span<uint8_t> recv,
                                         absl::Time deadline) {
  if (absl::Status s = Send(send_peer, send, deadline); !s.ok()) return s;
  return Recv(recv_peer, recv, deadline);
}

}  // namespace tpudist::collectives::tcp
