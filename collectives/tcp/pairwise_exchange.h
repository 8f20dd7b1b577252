// PairwiseExchange: an all-to-all whose blocks stay where the caller keeps
// them (one span per peer), over a Transport, for a chosen subset of peers.
//
// tcp::AllToAll (ring_algorithms.h) wants one packed input and one packed
// output buffer, so a caller whose blocks live in separate tensors (or who
// moves some blocks another way, e.g. through shm inside a host) pays a pack
// and an unpack copy of the whole buffer, plus the page faults of two fresh
// staging buffers. Here every block is sent from and received into the
// caller's memory directly, and peers the caller excludes are never touched.
//
// Schedule: the pairwise exchange of ring_schedule.h: at step s in [1, W-1]
// rank r sends send[r+s] to rank r+s and receives recv[r-s] from rank r-s
// (mod W). A step's send (receive) is skipped when that peer is excluded or
// its block is empty; the step is then a plain Recv (Send), or nothing.
// Both sides of a pair skip together because they agree on the sizes and on
// the exclusion (see REQUIRES), so the messages stay matched; every ordered
// pair meets once, steps run in the same order everywhere, so the exchange
// cannot deadlock (a rank at the lowest step only waits for ranks that are
// at that step or have already handed their bytes to the transport).
//
// Thread-safety: as Transport (one call at a time per transport).
#ifndef TPU_DIST_COLLECTIVES_TCP_PAIRWISE_EXCHANGE_H_
#define TPU_DIST_COLLECTIVES_TCP_PAIRWISE_EXCHANGE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "collectives/tcp/transport.h"

namespace tpudist::collectives::tcp {

// Moves send[p] to rank p and receives recv[p] from rank p for every peer p
// with exchange_with[p] set (p != rank). Blocks of this rank itself
// (send[rank], recv[rank]) and of excluded peers are left alone: the caller
// moves them.
// REQUIRES: send.size() == recv.size() == exchange_with.size() == W;
// exchange_with is symmetric across ranks (rank r includes p iff p includes
// r); rank r's send[p].size() equals rank p's recv[r].size() for every
// included pair (a caller that cannot guarantee it must check first: a
// non-empty vs empty disagreement leaves a receiver waiting until
// `deadline`); no send block overlaps a receive block.
// Errors: the transport's (naming rank, peer, bytes), prefixed with the step.
absl::Status PairwiseExchange(Transport& transport,
                              absl::Span<const absl::Span<const uint8_t>> send,
                              absl::Span<const absl::Span<uint8_t>> recv,
                              absl::Span<const bool> exchange_with, absl::Time deadline);

}  // namespace tpudist::collectives::tcp

#endif  // TPU_DIST_COLLECTIVES_TCP_PAIRWISE_EXCHANGE_H_
