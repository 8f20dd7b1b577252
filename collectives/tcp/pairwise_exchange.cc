#include "collectives/tcp/pairwise_exchange.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "collectives/tcp/ring_schedule.h"

namespace tpudist::collectives::tcp {

absl::Status PairwiseExchange(Transport& transport,
                              absl::Span<const absl::Span<const uint8_t>> send,
                              absl::Span<const absl::Span<uint8_t>> recv,
                              absl::Span<const bool> exchange_with, absl::Time deadline) {
  const int w = transport.size();
  const int r = transport.rank();
  if (send.size() != static_cast<size_t>(w) || recv.size() != static_cast<size_t>(w) ||
      exchange_with.size() != static_cast<size_t>(w)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PairwiseExchange on rank ", r, " of ", w, ": ", send.size(), " send blocks, ",
        recv.size(), " receive blocks, ", exchange_with.size(), " peer flags; want ", w, " each"));
  }
  for (int step = 1; step < w; ++step) {
    const int to = AllToAllSendPeer(r, w, step);
    const int from = AllToAllRecvPeer(r, w, step);
    const bool do_send = exchange_with[to] && !send[to].empty();
    const bool do_recv = exchange_with[from] && !recv[from].empty();
    absl::Status s;
    if (do_send && do_recv) {
      s = transport.SendRecv(to, send[to], from, recv[from], deadline);
    } else if (do_send) {
      s = transport.Send(to, send[to], deadline);
    } else if (do_recv) {
      s = transport.Recv(from, recv[from], deadline);
    }
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("PairwiseExchange step ", step, " of ", w - 1,
                                                 " (to rank ", to, ", from rank ", from,
                                                 "): ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tpudist::collectives::tcp
