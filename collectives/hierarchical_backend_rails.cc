// The multi-rail paths of HierarchicalBackend (the rest of the backend is in
// hierarchical_backend.cc). Notation: H hosts of n ranks each (a uniform
// layout), local rank i of host h = hosts[h][i]; rail i = the TcpMesh among
// local rank i of every host (mesh rank = host index).
//
// The leaders path sends every cross-host byte through one TCP connection per
// host pair, driven by one process per host, while the host's other ranks
// wait. Here every local rank carries 1/n of the payload over its own rail,
// all rails at once, and the intra-host steps are the bandwidth-optimal shm
// reduce-scatter / all-gather instead of reduce-to-one / broadcast-from-one.
// The bytes crossing hosts are the same (they are bounded by the op), but
// they are spread over n connections and n processes.
//
// Every op first all-gathers the op headers over its rail (CheckRail): each
// rail checks that the hosts' local rank i called the same op, and the shm
// steps check the host's ranks against each other, so any mismatch is found.
//
// All-reduce (count elements, s = count / n, t = count - n s):
//   1. shm::ReduceScatter of n shards of s elements: local rank i ends with
//      its host's sum of shard i (in place, [i s, (i + 1) s)); if t > 0,
//      shm::Reduce of the t tail elements into local rank n - 1, whose rail
//      then carries [(n - 1) s, count) (contiguous);
//   2. every rail: tcp::RingAllReduce of its shard (AVG runs as SUM, each
//      rank divides its shard by W);
//   3. shm::AllGather of the shards (and shm::Broadcast of the tail from
//      local rank n - 1).
// Reduce-scatter (W input blocks of count elements): for each host g,
//   shm::ReduceScatter of the blocks of g's ranks (local rank i gets the
//   host sum of the block for hosts[g][i]) into slot g of a [H x count]
//   buffer; rail i then tcp::RingReduceScatter's the H slots, leaving slot h
//   = the full sum for hosts[h][i] on host h.
// All-gather (bytes per rank): rail i tcp::RingAllGather's the blocks of
//   local rank i of every host into a [H x bytes] buffer; then for each
//   host g, shm::AllGather of slot g straight into the caller's outs of g's
//   ranks.
// Broadcast (bytes, root on host R): shm::Broadcast of the whole payload on
//   host R; rail i tcp::RingBroadcast's piece i (bytes / n, the last piece
//   with the remainder) from host R; on the other hosts shm::AllGather of
//   the equal pieces (and shm::Broadcast of the remainder).
// Pipelining: each op is cut into chunks of about options.rail_chunk_bytes
// and run through RunRailPipeline (hierarchical_backend_pipeline.h): the
// shm steps of one chunk on the calling thread overlap the TCP step of
// another on a helper thread. All-reduce chunks are half that (its TCP step
// moves twice the bytes per chunk; 2 MiB chunks beat 4 MiB at 2 x 2,
// bench/README.md "Goal 3: cross-host all_reduce"), multiples of n elements
// except the last, so only the last chunk has a tail.
// Non-divisible counts add at most one small shm op per step. Failures go
// through FailLocal / FailRail, which poison the backend; a rank blocked on
// its rail while its host fails sees its rail peers' connections close (they
// are poisoned through their own host's shm), so every rank fails promptly.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/core/chunking.h"
#include "collectives/core/reduce_kernels.h"
#include "collectives/hierarchical_backend.h"
#include "collectives/shm/algorithms.h"
#include "collectives/tcp/ring_algorithms.h"

namespace tpudist::collectives {
namespace {

// `spec` narrowed to `count` elements (a shard of the op), for the shm steps.
OpSpec Shard(const OpSpec& spec, int64_t count) {
  OpSpec s = spec;
  s.count = count;
  s.shape = {count};
  return s;
}

uint8_t* At(void* p, int64_t off) { return static_cast<uint8_t*>(p) + off; }
const uint8_t* At(const void* p, int64_t off) { return static_cast<const uint8_t*>(p) + off; }

}  // namespace

absl::Status HierarchicalBackend::RunRails(const OpSpec& spec, int64_t chunks,
                                           const RailStages& stages) {
  RailStages s = stages;
  s.abort_shm = [this](const absl::Status& st) { local_->RequestAbort(st); };
  s.abort_tcp = [this](const absl::Status& st) { rail_->Abort(st.message()); };
  const RailPipelineResult r = RunRailPipeline(std::max<int64_t>(1, chunks), s,
                                               spec.ctx.deadline());
  if (r.status.ok()) return r.status;
  return r.tcp_failed ? FailRail(r.status) : FailLocal(r.status);
}

absl::Status HierarchicalBackend::AllReduceRails(const OpSpec& spec, ReduceKind op,
                                                 void* data) {
  const int64_t es = static_cast<int64_t>(ElementSize(spec.dtype));
  const int n = local_size(), i = layout_.local_index[rank_];
  const ReduceKind wire_op = op == ReduceKind::kAvg ? ReduceKind::kSum : op;
  if (absl::Status st = CheckRail(spec, MakeHeader(spec, OpKind::kAllreduce, op, -1, true));
      !st.ok()) {
    return st;
  }
  // Chunks of half the option (the TCP step is a reduce-scatter and an
  // all-gather: twice the rail bytes per chunk of the other ops), a multiple
  // of n elements; only the last one may have a tail.
  const int64_t chunk = std::max<int64_t>(1, rail_chunk_bytes_ / 2 / es / n) * n;
  const ReduceFn reduce = MakeReduceFn(spec.dtype, wire_op);
  struct Piece {
    int64_t begin, s, tail;  // chunk start, shard elements, tail elements
    uint8_t* shard(void* data, int64_t j, int64_t es) const { return At(data, (begin + j * s) * es); }
  };
  const int64_t n_chunks = NumChunks(spec.count, chunk);
  auto piece = [&](int64_t k) {
    const Range c = ChunkRange(spec.count, chunk, k);
    return Piece{c.begin, c.size / n, c.size - c.size / n * n};
  };
  RailStages stages;
  stages.before = [&](int64_t k) {
    const Piece p = piece(k);
    std::vector<const void*> ins(n);
    for (int j = 0; j < n; ++j) ins[j] = p.shard(data, j, es);
    absl::Status st = shm::ReduceScatter(*local_, Shard(spec, p.s), wire_op, ins,
                                         p.shard(data, i, es));
    if (!st.ok() || p.tail == 0) return st;
    return shm::Reduce(*local_, Shard(spec, p.tail), wire_op, n - 1, p.shard(data, n, es));
  };
  stages.tcp = [&](int64_t k) {
    const Piece p = piece(k);
    const int64_t mine = p.s + (i == n - 1 ? p.tail : 0);
    absl::Status st = tcp::RingAllReduce(
        *rail_, absl::Span<uint8_t>(p.shard(data, i, es), mine * es), es, reduce,
        spec.ctx.deadline());
    if (st.ok() && op == ReduceKind::kAvg) {
      DivideInPlace(spec.dtype, p.shard(data, i, es), mine, size_);
    }
    return st;
  };
  stages.after = [&](int64_t k) {
    const Piece p = piece(k);
    std::vector<void*> outs(n);
    for (int j = 0; j < n; ++j) outs[j] = p.shard(data, j, es);
    absl::Status st =
        shm::AllGather(*local_, Shard(spec, p.s), p.shard(data, i, es), p.s * es, outs);
    if (!st.ok() || p.tail == 0) return st;
    return shm::Broadcast(*local_, Shard(spec, p.tail), n - 1, p.shard(data, n, es),
                          p.tail * es);
  };
  return RunRails(spec, n_chunks, stages);
}

absl::Status HierarchicalBackend::ReduceScatterRails(const OpSpec& spec, ReduceKind op,
                                                     absl::Span<const void* const> inputs,
                                                     void* out) {
  const int64_t es = static_cast<int64_t>(ElementSize(spec.dtype));
  const int hosts = layout_.num_hosts(), n = local_size();
  const ReduceKind wire_op = op == ReduceKind::kAvg ? ReduceKind::kSum : op;
  if (absl::Status st =
          CheckRail(spec, MakeHeader(spec, OpKind::kReduceScatter, op, -1, true));
      !st.ok()) {
    return st;
  }
  // Chunk k of every block; buf is chunk-major: chunk k's [H x c] host slots
  // at H * begin elements (slot g = the host sum of g's ranks' blocks).
  const int64_t chunk = std::max<int64_t>(1, rail_chunk_bytes_ / es / (hosts * n));
  const ReduceFn reduce = MakeReduceFn(spec.dtype, wire_op);
  std::vector<uint8_t> buf(std::max<int64_t>(1, hosts * spec.count * es));
  auto slot = [&](const Range& c, int g) {
    return buf.data() + (hosts * c.begin + g * c.size) * es;
  };
  RailStages stages;
  stages.before = [&](int64_t k) {
    const Range c = ChunkRange(spec.count, chunk, k);
    std::vector<const void*> ins(n);
    for (int g = 0; g < hosts; ++g) {
      for (int j = 0; j < n; ++j) ins[j] = At(inputs[layout_.hosts[g][j]], c.begin * es);
      absl::Status st = shm::ReduceScatter(*local_, Shard(spec, c.size), wire_op, ins, slot(c, g));
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  };
  stages.tcp = [&](int64_t k) {
    const Range c = ChunkRange(spec.count, chunk, k);
    absl::Status st = tcp::RingReduceScatter(
        *rail_, absl::Span<uint8_t>(slot(c, 0), hosts * c.size * es), es, reduce,
        spec.ctx.deadline());
    if (!st.ok()) return st;
    if (op == ReduceKind::kAvg) DivideInPlace(spec.dtype, slot(c, host_), c.size, size_);
    std::memcpy(At(out, c.begin * es), slot(c, host_), c.size * es);
    return absl::OkStatus();
  };
  return RunRails(spec, NumChunks(spec.count, chunk), stages);
}

absl::Status HierarchicalBackend::AllGatherRails(const OpSpec& spec, const void* in,
                                                 int64_t bytes, absl::Span<void* const> outs) {
  const int hosts = layout_.num_hosts(), n = local_size();
  if (absl::Status st =
          CheckRail(spec, MakeHeader(spec, OpKind::kAllgather, ReduceKind{}, -1, true));
      !st.ok()) {
    return st;
  }
  // Chunks of each rank's block; buf is chunk-major: chunk k's [H x c]
  // (slot g = chunk k of local rank i of host g) at H * begin bytes.
  const int64_t chunk = std::max<int64_t>(1, rail_chunk_bytes_ / (hosts * n));
  std::vector<uint8_t> buf(std::max<int64_t>(1, hosts * bytes));
  auto slot = [&](const Range& c, int g) { return buf.data() + hosts * c.begin + g * c.size; };
  RailStages stages;
  stages.before = [&](int64_t k) {
    const Range c = ChunkRange(bytes, chunk, k);
    std::memcpy(slot(c, host_), At(in, c.begin), c.size);
    return absl::OkStatus();
  };
  stages.tcp = [&](int64_t k) {
    const Range c = ChunkRange(bytes, chunk, k);
    return tcp::RingAllGather(*rail_, absl::Span<uint8_t>(slot(c, 0), hosts * c.size),
                              spec.ctx.deadline());
  };
  stages.after = [&](int64_t k) {
    const Range c = ChunkRange(bytes, chunk, k);
    std::vector<void*> local_outs(n);
    for (int g = 0; g < hosts; ++g) {
      for (int j = 0; j < n; ++j) local_outs[j] = At(outs[layout_.hosts[g][j]], c.begin);
      absl::Status st = shm::AllGather(*local_, spec, slot(c, g), c.size, local_outs);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  };
  return RunRails(spec, NumChunks(bytes, chunk), stages);
}

absl::Status HierarchicalBackend::BroadcastRails(const OpSpec& spec, int root, void* data,
                                                 int64_t bytes) {
  const int n = local_size(), i = layout_.local_index[rank_];
  const int root_host = layout_.host_of_rank[root];
  if (absl::Status st =
          CheckRail(spec, MakeHeader(spec, OpKind::kBroadcast, ReduceKind{}, root, true));
      !st.ok()) {
    return st;
  }
  // Chunks of a multiple of n bytes; piece j of a chunk travels on rail j
  // (the last piece with the tail, only in the last chunk).
  const int64_t chunk = std::max<int64_t>(1, rail_chunk_bytes_ / n) * n;
  auto piece = [&](int64_t k, int64_t* p, int64_t* tail) {
    const Range c = ChunkRange(bytes, chunk, k);
    *p = c.size / n;
    *tail = c.size - *p * n;
    return c.begin;
  };
  RailStages stages;
  stages.before = [&](int64_t k) {
    if (host_ != root_host) return absl::OkStatus();
    const Range c = ChunkRange(bytes, chunk, k);
    return shm::Broadcast(*local_, spec, layout_.local_index[root], At(data, c.begin), c.size);
  };
  stages.tcp = [&](int64_t k) {
    int64_t p, tail;
    const int64_t begin = piece(k, &p, &tail);
    return tcp::RingBroadcast(
        *rail_, root_host,
        absl::Span<uint8_t>(At(data, begin + i * p), p + (i == n - 1 ? tail : 0)),
        spec.ctx.deadline());
  };
  stages.after = [&](int64_t k) {
    if (host_ == root_host) return absl::OkStatus();
    int64_t p, tail;
    const int64_t begin = piece(k, &p, &tail);
    std::vector<void*> outs(n);
    for (int j = 0; j < n; ++j) outs[j] = At(data, begin + j * p);
    absl::Status st = shm::AllGather(*local_, spec, outs[i], p, outs);
    if (!st.ok() || tail == 0) return st;
    return shm::Broadcast(*local_, spec, n - 1, At(data, begin + n * p), tail);
  };
  return RunRails(spec, NumChunks(bytes, chunk), stages);
}

}  // namespace tpudist::collectives
