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
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
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
  // One look for a Recv of `tag` that no frame is filling (transport's lock
  // held): `aborted` if not OK; OK with the oldest queued message of `tag`
  // moved into *m; Unavailable if the peer is gone; DeadlineExceeded once
  // `deadline` passed ("<what> timed out after <since start> <why_none>");
  // nullopt: nothing yet, wait on. `what` names the Recv.
  std::optional<absl::Status> Look(int tag, const absl::Status& aborted, absl::Time start,
                                   absl::Time deadline, absl::string_view what,
                                   absl::string_view why_none, P2pMessage* m) {
    if (!aborted.ok()) return aborted;
    if (std::optional<P2pMessage> queued = TakeQueued(tag)) {
      *m = std::move(*queued);
      return absl::OkStatus();
    }
    if (!closed.ok()) {
      return absl::UnavailableError(absl::StrCat(what, ": ", closed.message()));
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, " timed out after ", absl::FormatDuration(now - start), " ", why_none));
    }
    return std::nullopt;
  }
};

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_CORE_P2P_INBOX_H_
