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
// The blocks of included peers that are not empty go to Transport::Exchange
// in one call: TcpMesh moves them all at once from one poll loop (every
// socket busy, no step waits for the slowest pair), other transports run the
// pairwise schedule of ring_schedule.h (step s in [1, W-1]: send to r+s,
// receive from r-s, mod W; a step whose send or receive is excluded or empty
// is a plain Recv or Send, or nothing). Both sides of a pair leave a block
// out together because they agree on the sizes and on the exclusion (see
// REQUIRES), so the messages stay matched; in the step schedule every
// ordered pair meets once and steps run in the same order everywhere, so it
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
// Errors: the transport's (naming rank, peer, bytes; the step schedule
// prefixes the step).
absl::Status PairwiseExchange(Transport& transport,
                              absl::Span<const absl::Span<const uint8_t>> send,
                              absl::Span<const absl::Span<uint8_t>> recv,
                              absl::Span<const bool> exchange_with, absl::Time deadline);

}  // namespace tpudist::collectives::tcp

#endif  // TPU_DIST_COLLECTIVES_TCP_PAIRWISE_EXCHANGE_H_
