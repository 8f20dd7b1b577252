// The slice-hierarchical algorithms. Notation: S slices of L group ranks
// each, W = S x L; "position" p of a rank = its index among its slice's
// ranks in ascending group-rank order; DCN mesh p = the ranks at position p
// of every slice, mesh rank = slice index (slices ordered by lowest rank).
//
// All-reduce (count elements; AVG runs as SUM, divided by W once at the end):
//   1. in-slice reduce-scatter of the buffer zero-padded to L x ceil(count/L):
//      position p ends with the slice's sum of shard p;
//   2. DCN mesh p: op headers all-gathered and checked, then
//      tcp::RingAllReduce of shard p over the S slices (all L meshes at once,
//      each rank on its own connections);
//   3. in-slice all-gather of the L shards, the first count elements copied
//      back. The order of a sum is fixed: within a slice as its backend sums,
//      then across slices in ring order.
// Reduce-scatter (W blocks of count): block of rank r = (position p, slice t)
//   is placed at packed[p][t]; the in-slice reduce-scatter of L blocks of
//   S x count leaves position p with the slice's sum of its S blocks; a DCN
//   ring reduce-scatter over S blocks leaves slice t's rank with block t.
// All-gather: DCN ring all-gather of the S inputs at position p, then the
//   in-slice all-gather of those S-block buffers, unpacked into group order.
#include "collectives/slice_backend.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "collectives/core/reduce_kernels.h"
#include "collectives/tcp/ring_algorithms.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace tpudist::collectives {
namespace {

absl::Status WithPrefix(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

uint8_t* At(std::vector<uint8_t>& v, int64_t offset) { return v.data() + offset; }

}  // namespace

HostLayout ExchangePlacement(c10d::Store& store, int rank, int size,
                             const std::string& host_id, int slice_id,
                             std::chrono::milliseconds timeout) {
  const std::string mine = absl::StrCat(std::max(slice_id, 0), "/", host_id);
  store.set(absl::StrCat("place/", rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> hosts(size);
  std::vector<int> slices(size, 0);
  for (int r = 0; r < size; ++r) {
    const std::string key = absl::StrCat("place/", r);
    store.wait({key}, timeout);
    const std::vector<uint8_t> v = store.get(key);
    const std::string value(v.begin(), v.end());
    const size_t slash = value.find('/');
    // Written by ExchangePlacement only: "<slice>/<host id>".
    (void)absl::SimpleAtoi(value.substr(0, slash), &slices[r]);
    hosts[r] = slash == std::string::npos ? value : value.substr(slash + 1);
  }
  return ComputeHostLayout(hosts, slices);
}

absl::StatusOr<std::unique_ptr<CollectiveBackend>> CreateMultiHostBackend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const HostLayout& layout, const HierarchicalOptions& options) {
  if (layout.num_slices() > 1 && layout.uniform_slices()) {
    auto b = SliceBackend::Create(store, rank, size, layout, options);
    if (!b.ok()) return b.status();
    return std::unique_ptr<CollectiveBackend>(*std::move(b));
  }
  auto b = HierarchicalBackend::Create(store, rank, size, layout, options);
  if (!b.ok()) return b.status();
  return std::unique_ptr<CollectiveBackend>(*std::move(b));
}

absl::StatusOr<std::unique_ptr<SliceBackend>> SliceBackend::Create(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const HostLayout& layout, const HierarchicalOptions& options) {
  std::unique_ptr<SliceBackend> b(new SliceBackend(rank, size, layout, options.shm.group_name));
  // The whole group, every host a peer (the ops that do not split by slice).
  auto whole = HierarchicalBackend::Create(store, rank, size, layout, options);
  if (!whole.ok()) return whole.status();
  b->whole_ = *std::move(whole);

  // This slice's ranks, numbered by position; their hosts as in `layout`.
  const std::vector<int>& members = layout.slices[b->slice_];
  const int l = static_cast<int>(members.size());
  if (l > 1) {
    HierarchicalOptions inner = options;
    inner.shm.group_name = absl::StrCat(options.shm.group_name, ".s", b->slice_);
    std::vector<std::string> ids;
    std::vector<int> labels;
    for (int r : members) {
      ids.push_back(absl::StrCat(layout.host_of_rank[r]));
      labels.push_back(r);
    }
    const HostLayout sub = ComputeHostLayout(ids);
    auto slice_store =
        c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("slice", b->slice_), store);
    if (sub.single_host()) {
      inner.shm.rank_labels = labels;  // messages name group ranks
      auto comm = shm::Communicator::Create(*slice_store, b->position_, l, inner.shm);
      if (!comm.ok()) return b->FailInner(comm.status());
      b->inner_ = std::make_unique<ShmBackend>(*std::move(comm), options.small_allreduce_bytes);
    } else {
      auto h = HierarchicalBackend::Create(slice_store, b->position_, l, sub, inner);
      if (!h.ok()) return b->FailInner(h.status());
      b->inner_ = *std::move(h);
    }
  }

  tcp::TcpMeshOptions mesh;
  mesh.bind_address = options.bind_address;
  mesh.advertise_address = options.advertise_address;
  mesh.connect_timeout = options.connect_timeout;
  mesh.secret = options.job_secret;
  mesh.group_key = absl::StrCat(options.shm.group_name, "/dcn", b->position_);
  auto dcn = tcp::TcpMesh::Connect(*store, b->slice_, layout.num_slices(), mesh);
  if (!dcn.ok()) return b->FailDcn(dcn.status());
  b->dcn_ = *std::move(dcn);
  return b;
}

SliceBackend::SliceBackend(int rank, int size, const HostLayout& layout,
                           std::string group_name)
    : rank_(rank),
      size_(size),
      layout_(layout),
      slice_(layout.slice_of_rank[rank]),
      position_(layout.slice_index[rank]),
      group_name_(std::move(group_name)) {}

OpSpec SliceBackend::InnerSpec(const OpSpec& spec, int64_t count) const {
  OpSpec inner = spec;
  inner.count = count;
  inner.shape = {count};
  return inner;
}

absl::Status SliceBackend::CheckDcn(const OpSpec& spec, const OpHeader& mine) {
  const int slices = layout_.num_slices();
  std::vector<OpHeader> all(slices);
  all[slice_] = mine;
  absl::Span<uint8_t> bytes(reinterpret_cast<uint8_t*>(all.data()), slices * sizeof(OpHeader));
  if (absl::Status s = tcp::RingAllGather(*dcn_, bytes, spec.ctx.deadline()); !s.ok()) {
    return FailDcn(s);
  }
  bool agree = true;
  for (int t = 0; t < slices && agree; ++t) agree = HeadersAgree(mine, all[t]);
  if (agree) return absl::OkStatus();
  std::vector<std::string> lines;
  for (int t = 0; t < slices; ++t) {
    lines.push_back(absl::StrCat("slice ", t, " (group rank ", layout_.slices[t][position_],
                                 "): ", DescribeHeader(all[t])));
  }
  return Poison(absl::InvalidArgumentError(absl::StrCat(
      spec.ctx.name, " on rank ", rank_, " of group '", group_name_,
      "': slices called mismatched collectives: ", absl::StrJoin(lines, "; "))));
}

absl::Status SliceBackend::AllReduce(const OpSpec& spec, ReduceKind op, void* data) {
  if (absl::Status p = poison_status(); !p.ok()) return p;
  const int64_t es = static_cast<int64_t>(ElementSize(spec.dtype));
  const int l = slice_size();
  const ReduceKind wire_op = op == ReduceKind::kAvg ? ReduceKind::kSum : op;
  const int64_t shard = (spec.count + l - 1) / l;
  shard_.assign(shard * es, 0);
  if (inner_) {
    scratch_.assign(l * shard * es, 0);
    std::memcpy(scratch_.data(), data, spec.count * es);
    std::vector<const void*> ins(l);
    for (int p = 0; p < l; ++p) ins[p] = At(scratch_, p * shard * es);
    if (absl::Status s = inner_->ReduceScatter(InnerSpec(spec, shard), wire_op, ins,
                                               shard_.data());
        !s.ok()) {
      return FailInner(s);
    }
  } else {
    std::memcpy(shard_.data(), data, spec.count * es);
  }
  if (absl::Status s = CheckDcn(spec, MakeHeader(spec, OpKind::kAllreduce, op, -1, true));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = tcp::RingAllReduce(*dcn_, absl::MakeSpan(shard_), es,
                                          MakeReduceFn(spec.dtype, wire_op),
                                          spec.ctx.deadline());
      !s.ok()) {
    return FailDcn(s);
  }
  if (op == ReduceKind::kAvg) DivideInPlace(spec.dtype, shard_.data(), shard, size_);
  if (!inner_) {
    std::memcpy(data, shard_.data(), spec.count * es);
    return absl::OkStatus();
  }
  std::vector<void*> outs(l);
  for (int p = 0; p < l; ++p) outs[p] = At(scratch_, p * shard * es);
  if (absl::Status s = inner_->AllGather(InnerSpec(spec, shard), shard_.data(), shard * es,
                                         outs);
      !s.ok()) {
    return FailInner(s);
  }
  std::memcpy(data, scratch_.data(), spec.count * es);
  return absl::OkStatus();
}

absl::Status SliceBackend::ReduceScatter(const OpSpec& spec, ReduceKind op,
                                         absl::Span<const void* const> inputs, void* out) {
  if (absl::Status p = poison_status(); !p.ok()) return p;
  const int64_t es = static_cast<int64_t>(ElementSize(spec.dtype));
  const int l = slice_size();
  const int slices = layout_.num_slices();
  const int64_t block = spec.count * es;
  const ReduceKind wire_op = op == ReduceKind::kAvg ? ReduceKind::kSum : op;
  // packed[p][t] = the block for the rank at position p of slice t.
  scratch_.resize(static_cast<size_t>(l) * slices * block);
  for (int p = 0; p < l; ++p) {
    for (int t = 0; t < slices; ++t) {
      std::memcpy(At(scratch_, (p * slices + t) * block), inputs[layout_.slices[t][p]], block);
    }
  }
  shard_.resize(static_cast<size_t>(slices) * block);
  if (inner_) {
    std::vector<const void*> ins(l);
    for (int p = 0; p < l; ++p) ins[p] = At(scratch_, p * slices * block);
    if (absl::Status s = inner_->ReduceScatter(InnerSpec(spec, spec.count * slices), wire_op,
                                               ins, shard_.data());
        !s.ok()) {
      return FailInner(s);
    }
  } else {
    std::memcpy(shard_.data(), scratch_.data(), shard_.size());
  }
  if (absl::Status s = CheckDcn(spec, MakeHeader(spec, OpKind::kReduceScatter, op, -1, true));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = tcp::RingReduceScatter(*dcn_, absl::MakeSpan(shard_), es,
                                              MakeReduceFn(spec.dtype, wire_op),
                                              spec.ctx.deadline());
      !s.ok()) {
    return FailDcn(s);
  }
  uint8_t* mine = At(shard_, slice_ * block);
  if (op == ReduceKind::kAvg) DivideInPlace(spec.dtype, mine, spec.count, size_);
  std::memcpy(out, mine, block);
  return absl::OkStatus();
}

absl::Status SliceBackend::AllGather(const OpSpec& spec, const void* in, int64_t bytes,
                                     absl::Span<void* const> outs) {
  if (absl::Status p = poison_status(); !p.ok()) return p;
  const int l = slice_size();
  const int slices = layout_.num_slices();
  shard_.resize(static_cast<size_t>(slices) * bytes);
  std::memcpy(At(shard_, slice_ * bytes), in, bytes);
  if (absl::Status s = CheckDcn(spec, MakeHeader(spec, OpKind::kAllgather, ReduceKind{}, -1,
                                                 true));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = tcp::RingAllGather(*dcn_, absl::MakeSpan(shard_), spec.ctx.deadline());
      !s.ok()) {
    return FailDcn(s);
  }
  // packed[p] = the S inputs of position p, slice-ordered.
  scratch_.resize(static_cast<size_t>(l) * slices * bytes);
  if (inner_) {
    std::vector<void*> packed(l);
    for (int p = 0; p < l; ++p) packed[p] = At(scratch_, p * slices * bytes);
    if (absl::Status s = inner_->AllGather(InnerSpec(spec, spec.count * slices), shard_.data(),
                                           slices * bytes, packed);
        !s.ok()) {
      return FailInner(s);
    }
  } else {
    std::memcpy(scratch_.data(), shard_.data(), shard_.size());
  }
  for (int p = 0; p < l; ++p) {
    for (int t = 0; t < slices; ++t) {
      std::memcpy(outs[layout_.slices[t][p]], At(scratch_, (p * slices + t) * bytes), bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status SliceBackend::Reduce(const OpSpec& spec, ReduceKind op, int root, void* data) {
  return whole_->Reduce(spec, op, root, data);
}
absl::Status SliceBackend::Broadcast(const OpSpec& spec, int root, void* data, int64_t bytes) {
  return whole_->Broadcast(spec, root, data, bytes);
}
absl::Status SliceBackend::Gather(const OpSpec& spec, int root, const void* in, int64_t bytes,
                                  absl::Span<void* const> outs) {
  return whole_->Gather(spec, root, in, bytes, outs);
}
absl::Status SliceBackend::Scatter(const OpSpec& spec, int root,
                                   absl::Span<const void* const> ins, void* out,
                                   int64_t bytes) {
  return whole_->Scatter(spec, root, ins, out, bytes);
}
absl::Status SliceBackend::AllToAll(const OpSpec& spec, absl::Span<const void* const> ins,
                                    absl::Span<const int64_t> in_bytes,
                                    absl::Span<void* const> outs,
                                    absl::Span<const int64_t> out_bytes) {
  return whole_->AllToAll(spec, ins, in_bytes, outs, out_bytes);
}
absl::Status SliceBackend::Barrier(const OpSpec& spec) { return whole_->Barrier(spec); }

absl::Status SliceBackend::poison_status() const {
  {
    absl::MutexLock lock(&mu_);
    if (!poison_.ok()) return poison_;
  }
  if (absl::Status s = whole_->poison_status(); !s.ok()) return s;
  return inner_ ? inner_->poison_status() : absl::OkStatus();
}

absl::Status SliceBackend::Poison(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (!poison_.ok()) return poison_;
    poison_ = std::move(status);
  }
  absl::Status p;
  {
    absl::MutexLock lock(&mu_);
    p = poison_;
  }
  if (whole_) (void)whole_->Poison(p);
  if (inner_) (void)inner_->Poison(p);
  if (dcn_) dcn_->Abort(p.message());
  return p;
}

void SliceBackend::Abort(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (poison_.ok()) poison_ = status;
  }
  if (whole_) whole_->Abort(status);
  if (inner_) inner_->Abort(status);
  if (dcn_) dcn_->Abort(status.message());
}

absl::Status SliceBackend::FailInner(const absl::Status& s) {
  return Poison(WithPrefix(s, absl::StrCat("[group '", group_name_, "' rank ", rank_,
                                           ", inside slice ", slice_, " (group ranks ",
                                           absl::StrJoin(layout_.slices[slice_], ","), ")] ")));
}

absl::Status SliceBackend::FailDcn(const absl::Status& s) {
  std::vector<std::string> map;
  for (int t = 0; t < layout_.num_slices(); ++t) {
    map.push_back(absl::StrCat("mesh rank ", t, " = slice ", t, " (group rank ",
                               layout_.slices[t][position_], ")"));
  }
  return Poison(WithPrefix(s, absl::StrCat("[group '", group_name_, "' rank ", rank_,
                                           ", DCN among in-slice position ", position_,
                                           " of every slice; ", absl::StrJoin(map, ", "),
                                           "] ")));
}

}  // namespace tpudist::collectives
