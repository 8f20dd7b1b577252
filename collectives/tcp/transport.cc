// Transport::Exchange's default: the pairwise schedule, one step at a time.
#include "collectives/tcp/transport.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/tcp/ring_schedule.h"

namespace tpudist::collectives::tcp {

absl::Status Transport::Exchange(absl::Span<const SendBlock> sends,
                                 absl::Span<const RecvBlock> recvs, absl::Time deadline) {
  const int w = size();
  const int r = rank();
  std::vector<const SendBlock*> send_to(w, nullptr);  // [W]
  std::vector<const RecvBlock*> recv_from(w, nullptr);  // [W]
  for (const SendBlock& b : sends) {
    if (b.peer < 0 || b.peer >= w || b.peer == r || send_to[b.peer] != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("Exchange on rank ", r, " of ", w, ": bad or repeated send peer ", b.peer));
    }
    send_to[b.peer] = &b;
  }
  for (const RecvBlock& b : recvs) {
    if (b.peer < 0 || b.peer >= w || b.peer == r || recv_from[b.peer] != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Exchange on rank ", r, " of ", w, ": bad or repeated receive peer ", b.peer));
    }
    recv_from[b.peer] = &b;
  }
  for (int step = 1; step < w; ++step) {
    const int to = AllToAllSendPeer(r, w, step);
    const int from = AllToAllRecvPeer(r, w, step);
    absl::Status s;
    if (send_to[to] != nullptr && recv_from[from] != nullptr) {
      s = SendRecv(to, send_to[to]->data, from, recv_from[from]->data, deadline);
    } else if (send_to[to] != nullptr) {
      s = Send(to, send_to[to]->data, deadline);
    } else if (recv_from[from] != nullptr) {
      s = Recv(from, recv_from[from]->data, deadline);
    }
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("Exchange step ", step, " of ", w - 1,
                                                 " (to rank ", to, ", from rank ", from,
                                                 "): ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tpudist::collectives::tcp
