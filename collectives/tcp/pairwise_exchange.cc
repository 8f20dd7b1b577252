#include "collectives/tcp/pairwise_exchange.h"

#include <vector>

#include "absl/strings/str_cat.h"

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
  std::vector<SendBlock> sends;
  std::vector<RecvBlock> recvs;
  for (int p = 0; p < w; ++p) {
    if (p == r || !exchange_with[p]) continue;
    if (!send[p].empty()) sends.push_back({p, send[p]});
    if (!recv[p].empty()) recvs.push_back({p, recv[p]});
  }
  return transport.Exchange(sends, recvs, deadline);
}

}  // namespace tpudist::collectives::tcp
