#include "collectives/tcp/ring_algorithms.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tpudist::collectives::tcp {
namespace {

absl::Status Invalid(const Transport& t, absl::string_view op, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(op, " on rank ", t.rank(), ": ", what));
}

// Adds the collective's name to a transport error so the caller sees both.
absl::Status Annotate(absl::Status s, absl::string_view op, int step) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(op, " step ", step, ": ", s.message()));
}

std::vector<Range> Scaled(std::vector<Range> blocks, int64_t factor) {
  for (Range& b : blocks) {
    b.begin *= factor;
    b.size *= factor;
  }
  return blocks;
}

// The reduce-scatter phase.
//
// The ring reduce-scatter works as follows. The buffer is cut into W blocks
// (`blocks`, in elements). In step s (0 <= s < W-1) rank r sends block
// r-s-1 to its successor and receives block r-s-2 from its predecessor, which
// it folds into its own copy with `reduce`. The block a rank sends in step s
// is the one it received and reduced in step s-1, so after W-1 steps each
// block has been folded through every rank once and rank r holds the full
// reduction of block r (ring_schedule.h's RsSendBlock/RsRecvBlock).
//
// Each step is cut into segments of at most max_segment_bytes (the same
// number of segments for every block, so sender and receiver agree on the
// boundaries), received into two alternating scratch buffers. Within a step
// the segments a rank sends do not depend on the reductions of that step, so
// the reduction of segment k runs as the `overlap` of segment k+1's
// SendRecvOverlapped: TcpMesh first pushes segment k+1 into the socket
// buffers, reduces segment k while the kernel moves it, then finishes. The
// last segment of a step is reduced before the next step starts, because the
// next step sends the whole block just reduced.
absl::Status ReduceScatterPhase(Transport& t, absl::Span<uint8_t> data,
                                const std::vector<Range>& blocks, size_t es, const ReduceFn& reduce,
                                absl::Time deadline, size_t max_segment, absl::string_view op) {
  const int w = t.size();
  const int r = t.rank();
  const int next = RingNext(r, w);
  const int prev = RingPrev(r, w);
  int64_t max_len = 0;
  for (const Range& b : blocks) max_len = std::max(max_len, b.size);
  const size_t num_segments = NumSegments(max_len, es, max_segment);
  const size_t scratch_bytes = ((max_len + num_segments - 1) / num_segments) * es;
  // Uninitialised: every byte is received before it is read.
  std::unique_ptr<uint8_t[]> scratch[2] = {
      std::unique_ptr<uint8_t[]>(new uint8_t[scratch_bytes]),
      std::unique_ptr<uint8_t[]>(new uint8_t[num_segments > 1 ? scratch_bytes : 0])};
  for (int step = 0; step < w - 1; ++step) {
    const Range& send_block = blocks[RsSendBlock(r, w, step)];
    const Range& recv_block = blocks[RsRecvBlock(r, w, step)];
    auto reduce_segment = [&](size_t k) {
      const Range v = SegmentOf(recv_block, k, num_segments);
      if (v.size > 0) reduce(data.data() + v.begin * es, scratch[k % 2].get(), v.size);
    };
    for (size_t k = 0; k < num_segments; ++k) {
      const Range s = SegmentOf(send_block, k, num_segments);
      const Range v = SegmentOf(recv_block, k, num_segments);
      const absl::Span<const uint8_t> out = data.subspan(s.begin * es, s.size * es);
      const absl::Span<uint8_t> in = absl::MakeSpan(scratch[k % 2].get(), v.size * es);
      absl::Status status =
          k == 0 ? t.SendRecv(next, out, prev, in, deadline)
                 : t.SendRecvOverlapped(
                       next, out, prev, in, [&] { reduce_segment(k - 1); }, deadline);
      if (!status.ok()) return Annotate(status, op, step);
    }
    reduce_segment(num_segments - 1);
  }
  return absl::OkStatus();
}

// The all-gather phase.
//
// The ring all-gather works as follows. Rank r starts owning block r (blocks
// in bytes, any sizes). In step s (0 <= s < W-1) it sends block r-s, which it
// owns or received in the previous step, to its successor and receives block
// r-s-1 from its predecessor, straight into place. After W-1 steps every block
// has travelled W-1 hops and every rank has all of them. Each SendRecv is full
// duplex, so a rank's outgoing and incoming blocks move at the same time.
absl::Status AllGatherPhase(Transport& t, absl::Span<uint8_t> data,
                            const std::vector<Range>& blocks, absl::Time deadline,
                            absl::string_view op) {
  const int w = t.size();
  const int r = t.rank();
  for (int step = 0; step < w - 1; ++step) {
    const Range& s = blocks[AgSendBlock(r, w, step)];
    const Range& v = blocks[AgRecvBlock(r, w, step)];
    absl::Status status = t.SendRecv(RingNext(r, w), data.subspan(s.begin, s.size),
                                     RingPrev(r, w), data.subspan(v.begin, v.size), deadline);
    if (!status.ok()) return Annotate(status, op, step);
  }
  return absl::OkStatus();
}

}  // namespace

// The ring all-reduce is a reduce-scatter followed by an all-gather over the
// same W near-equal blocks (PartitionEven of the element count). Each rank
// sends 2(W-1)/W of the buffer in total, independent of W, which is why it is
// the bandwidth-optimal choice for the few large inter-host messages a
// hierarchical process group sends; latency is 2(W-1) message hops.
absl::Status RingAllReduce(Transport& transport, absl::Span<uint8_t> data, size_t element_size,
                           const ReduceFn& reduce, absl::Time deadline,
                           const RingOptions& options) {
  constexpr absl::string_view kOp = "RingAllReduce";
  if (element_size == 0 || data.size() % element_size != 0) {
    return Invalid(
        transport, kOp,
        absl::StrCat(data.size(), " bytes is not a multiple of element size ", element_size));
  }
  const int w = transport.size();
  if (w == 1 || data.empty()) return absl::OkStatus();
  const std::vector<Range> blocks = PartitionEven(data.size() / element_size, w);
  if (absl::Status s = ReduceScatterPhase(transport, data, blocks, element_size, reduce, deadline,
                                          options.max_segment_bytes, kOp);
      !s.ok()) {
    return s;
  }
  return AllGatherPhase(transport, data, Scaled(blocks, static_cast<int64_t>(element_size)), deadline, kOp);
}

// Reduce-scatter with equal blocks is the first half of the ring all-reduce,
// with the caller's W blocks instead of a partition of the buffer.
absl::Status RingReduceScatter(Transport& transport, absl::Span<uint8_t> data, size_t element_size,
                               const ReduceFn& reduce, absl::Time deadline,
                               const RingOptions& options) {
  constexpr absl::string_view kOp = "RingReduceScatter";
  const int w = transport.size();
  if (element_size == 0 || data.size() % (element_size * w) != 0) {
    return Invalid(transport, kOp,
                   absl::StrCat(data.size(), " bytes is not ", w, " blocks of elements of ",
                                element_size, " bytes"));
  }
  if (w == 1 || data.empty()) return absl::OkStatus();
  const auto block_count = static_cast<int64_t>(data.size() / element_size / w);
  std::vector<Range> blocks(w);
  for (int i = 0; i < w; ++i) blocks[i] = Range{i * block_count, block_count};
  return ReduceScatterPhase(transport, data, blocks, element_size, reduce, deadline,
                            options.max_segment_bytes, kOp);
}

absl::Status RingAllGather(Transport& transport, absl::Span<uint8_t> data, absl::Time deadline) {
  const int w = transport.size();
  if (data.size() % w != 0) {
    return Invalid(transport, "RingAllGather",
                   absl::StrCat(data.size(), " bytes is not ", w, " equal blocks"));
  }
  std::vector<size_t> lengths(w, data.size() / w);
  return RingAllGatherV(transport, data, lengths, deadline);
}

absl::Status RingAllGatherV(Transport& transport, absl::Span<uint8_t> data,
                            absl::Span<const size_t> block_bytes, absl::Time deadline) {
  constexpr absl::string_view kOp = "RingAllGather";
  const int w = transport.size();
  if (block_bytes.size() != static_cast<size_t>(w) || TotalLength(block_bytes) != data.size()) {
    return Invalid(
        transport, kOp,
        absl::StrCat(block_bytes.size(), " block sizes summing to ", TotalLength(block_bytes),
                     " for ", w, " ranks and ", data.size(), " bytes"));
  }
  if (w == 1 || data.empty()) return absl::OkStatus();
  return AllGatherPhase(transport, data, BlocksFromLengths(block_bytes), deadline, kOp);
}

// The pipelined chain broadcast works as follows. The ranks form the chain
// root, root+1, ..., root-1 (mod W). The buffer is cut into segments of at
// most max_segment_bytes. The root sends segment after segment to its
// successor; every middle rank receives segment k from its predecessor while
// forwarding segment k-1 to its successor (one full-duplex SendRecv); the last
// rank only receives. For S bytes and n segments the time is about
// (n + W - 2) segment transfers instead of (W - 1) full-buffer transfers.
absl::Status RingBroadcast(Transport& transport, int root, absl::Span<uint8_t> data,
                           absl::Time deadline, const RingOptions& options) {
  constexpr absl::string_view kOp = "RingBroadcast";
  const int w = transport.size();
  const int r = transport.rank();
  if (root < 0 || root >= w) return Invalid(transport, kOp, absl::StrCat("bad root ", root));
  if (w == 1 || data.empty()) return absl::OkStatus();
  const int pos = ChainPosition(r, w, root);
  const int next = RingNext(r, w);
  const int prev = RingPrev(r, w);
  const size_t n = NumSegments(data.size(), 1, options.max_segment_bytes);
  const Range all{0, static_cast<int64_t>(data.size())};
  auto seg = [&](size_t k) {
    Range b = SegmentOf(all, k, n);
    return data.subspan(b.begin, b.size);
  };
  if (pos == 0) {
    for (size_t k = 0; k < n; ++k) {
      if (absl::Status s = transport.Send(next, seg(k), deadline); !s.ok()) {
        return Annotate(s, kOp, static_cast<int>(k));
      }
    }
    return absl::OkStatus();
  }
  for (size_t k = 0; k <= n; ++k) {
    absl::Status s;
    const bool send = pos < w - 1 && k >= 1;  // forward segment k-1
    const bool recv = k < n;                  // receive segment k
    if (send && recv) {
      s = transport.SendRecv(next, seg(k - 1), prev, seg(k), deadline);
    } else if (send) {
      s = transport.Send(next, seg(k - 1), deadline);
    } else if (recv) {
      s = transport.Recv(prev, seg(k), deadline);
    }
    if (!s.ok()) return Annotate(s, kOp, static_cast<int>(k));
  }
  return absl::OkStatus();
}

// The pairwise all-to-all works as follows. In step s (1 <= s < W) rank r
// sends its block for rank r+s and receives rank r-s's block for it, in one
// full-duplex SendRecv. Over the W-1 steps every ordered pair exchanges
// exactly once, each rank has one send and one receive in flight, and the
// block for itself is a local copy. Block sizes may differ per pair.
absl::Status AllToAll(Transport& transport, absl::Span<const uint8_t> input,
                      absl::Span<const size_t> send_bytes, absl::Span<uint8_t> output,
                      absl::Span<const size_t> recv_bytes, absl::Time deadline) {
  constexpr absl::string_view kOp = "AllToAll";
  const int w = transport.size();
  const int r = transport.rank();
  if (send_bytes.size() != static_cast<size_t>(w) || recv_bytes.size() != static_cast<size_t>(w) ||
      TotalLength(send_bytes) != input.size() || TotalLength(recv_bytes) != output.size() ||
      send_bytes[r] != recv_bytes[r]) {
    return Invalid(transport, kOp, "send/recv sizes do not match the buffers or W");
  }
  const std::vector<Range> out_blocks = BlocksFromLengths(send_bytes);
  const std::vector<Range> in_blocks = BlocksFromLengths(recv_bytes);
  if (send_bytes[r] > 0) {
    std::memcpy(output.data() + in_blocks[r].begin, input.data() + out_blocks[r].begin,
                send_bytes[r]);
  }
  for (int step = 1; step < w; ++step) {
    const int to = AllToAllSendPeer(r, w, step);
    const int from = AllToAllRecvPeer(r, w, step);
    absl::Status s = transport.SendRecv(
        to, input.subspan(out_blocks[to].begin, out_blocks[to].size), from,
        output.subspan(in_blocks[from].begin, in_blocks[from].size), deadline);
    if (!s.ok()) return Annotate(s, kOp, step);
  }
  return absl::OkStatus();
}

}  // namespace tpudist::collectives::tcp
