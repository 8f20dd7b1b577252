// What the point-to-point transports share (tcp/tcp_p2p.h over sockets,
// shm/p2p.h over shared-memory rings): a received message, a Recv posted for
// the reading thread to fill in place, and one peer's inbox with the single
// matching rule. A frame may go straight into the posted Recv only if it has
// that Recv's tag and size and nothing of that tag is queued ahead of it --
// else a message queued while the Recv was already waiting would be
// overtaken by the next one of its tag.
//
// Thread-safety: plain data; the transport guards an inbox with its mutex.
#ifndef TPU_DIST_COLLECTIVES_CORE_P2P_INBOX_H_
#define TPU_DIST_COLLECTIVES_CORE_P2P_INBOX_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tpudist::collectives {

struct P2pMessage {
  std::unique_ptr<uint8_t[]> bytes;  // [size]; null when size is 0
  uint64_t size = 0;
};

// A Recv waiting with nothing of its tag queued.
struct P2pPosted {
  int tag = 0;
  absl::Span<uint8_t> data;
  absl::Time deadline;
  enum State { kWaiting, kFilling, kDone } state = kWaiting;
  absl::Status status;  // of the fill, once kDone
};

struct P2pInbox {
  P2pPosted* posted = nullptr;                   // at most one: recvs from a peer are serial
  std::map<int, std::deque<P2pMessage>> queues;  // by tag, oldest first
  absl::Status closed;                           // the peer is gone (why), else OK

  // The oldest queued message of `tag`, moved out; nullopt if none.
  std::optional<P2pMessage> TakeQueued(int tag) {
    auto q = queues.find(tag);
    if (q == queues.end() || q->second.empty()) return std::nullopt;
    P2pMessage m = std::move(q->second.front());
    q->second.pop_front();
    return m;
  }
  // The posted Recv a frame of `tag` and `bytes` may fill in place (marked
  // kFilling), or null (the frame is queued instead).
  P2pPosted* ClaimPosted(int tag, uint64_t bytes) {
    P2pPosted* p = posted;
    if (p == nullptr || p->state != P2pPosted::kWaiting || p->tag != tag ||
        p->data.size() != bytes) {
      return nullptr;
    }
    auto q = queues.find(tag);
    if (q != queues.end() && !q->second.empty()) return nullptr;
    p->state = P2pPosted::kFilling;
    return p;
  }
};

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_CORE_P2P_INBOX_H_
