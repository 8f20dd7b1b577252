// The multi-host algorithms. Notation: W group ranks on H hosts, host h has
// n_h ranks; "leader" = local index 0 of a host. The all-reduce,
// reduce-scatter, all-gather and broadcast below are the leaders paths: for
// hosts of different sizes and for payloads under multi_rail_min_bytes.
// Larger payloads on hosts of equal size take the multi-rail paths
// (hierarchical_backend_rails.cc), where every local rank carries its share
// over its own TCP rail.
//
// Hierarchical all-reduce (also reduce):
//   1. intra-host: shm::Reduce of every local rank's buffer into the leader
//      (one pass over shm, fp32 accumulation for bf16/fp16, local ranks'
//      headers checked against each other);
//   2. leaders: all-gather of the op headers over the leaders' TcpMesh (every
//      host's call checked against every other; this also fails fast when a
//      host's leader is gone), then tcp::RingAllReduce of the leader buffers
//      (reduce-scatter + all-gather ring, 2(H-1)/H of the bytes per leader);
//      AVG runs as SUM and the leader divides by W once;
//   3. intra-host: shm::Broadcast from the leader (reduce: only on the
//      root's host, into a scratch buffer, then the root copies it out).
//   Only leaders touch the network, so TCP carries H, not W, buffers.
// Reduce-scatter: the W input blocks are laid out per host (host h's ranks
//   in a block of max_h n_h slots, zero padding), shm::Reduce of the whole
//   buffer into the leader, leaders tcp::RingReduceScatter of the H equal
//   host blocks (each leader ends with its host's reduced block; AVG divided
//   once), then shm::Scatter of that block to the host's ranks.
// All-gather: shm::Gather of the local inputs into the leader's host-major
//   buffer (hosts in order, then local index), leaders tcp::RingAllGatherV of
//   the unequal host blocks (n_h x bytes), shm::Broadcast of the whole
//   buffer, then every rank copies blocks into group-rank order (so hosts
//   may hold any, non-contiguous, subset of ranks).
// Broadcast: shm::Broadcast on the root's host from the root, leaders
//   tcp::RingBroadcast from the root's host, shm::Broadcast on the others.
// Barrier: local barrier, leaders' header exchange, local barrier.
// Gather / scatter / all-to-all: every rank sends {header, its send and
//   receive byte counts} to every rank over the flat mesh (one
//   TcpMesh::Exchange round) and checks headers and that
//   every pair agrees. Gather/scatter then run tcp::AllToAll over the flat
//   mesh (all-to-alls with one non-empty column/row, staged in packed
//   buffers). All-to-all: hierarchical_backend_all_to_all.cc.
#include "collectives/hierarchical_backend.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/core/op_header.h"
#include "collectives/core/reduce_kernels.h"
#include "collectives/shm/algorithms.h"
#include "collectives/shm/wait.h"
#include "collectives/tcp/ring_algorithms.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace tpudist::collectives {
namespace {

std::string HostRanks(const HostLayout& layout, int h) {
  return absl::StrJoin(layout.hosts[h], ",");
}

// Whether every host has the same number of ranks (the rails exist).
bool Uniform(const HostLayout& layout) {
  for (const auto& h : layout.hosts) {
    if (h.size() != layout.hosts[0].size()) return false;
  }
  return true;
}

absl::Status WithPrefix(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<HierarchicalBackend>> HierarchicalBackend::Create(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const HostLayout& layout, const HierarchicalOptions& options) {
  std::unique_ptr<HierarchicalBackend> b(
      new HierarchicalBackend(rank, size, layout, options.shm.group_name, options));
  const int h = b->host_;
  shm::CommOptions local_options = options.shm;
  local_options.group_name = absl::StrCat(options.shm.group_name, ".h", h);
  local_options.rank_labels = layout.hosts[h];  // messages name group ranks
  // Multi-rail ops run a TCP helper thread beside each rank's shm waits
  // (hierarchical_backend_pipeline.h): count two threads per local rank, so
  // that the shm waits do not spin once those threads outnumber the cores.
  if (!local_options.wait && b->uniform_ && b->local_size() > 1) {
    local_options.wait = shm::ChooseWaitPolicy(2 * b->local_size(), shm::UsableCores());
  }
  auto local_store = c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("host", h), store);
  auto local = shm::Communicator::Create(*local_store, layout.local_index[rank],
                                         b->local_size(), local_options);
  if (!local.ok()) return b->FailLocal(local.status());
  b->local_ = *std::move(local);

  tcp::TcpMeshOptions mesh_options;
  mesh_options.bind_address = options.bind_address;
  mesh_options.advertise_address = options.advertise_address;
  mesh_options.connect_timeout = options.connect_timeout;
  mesh_options.secret = options.job_secret;
  if (b->leader() || b->uniform_) {
    const int i = layout.local_index[rank];
    mesh_options.group_key = i == 0 ? absl::StrCat(options.shm.group_name, "/leaders")
                                    : absl::StrCat(options.shm.group_name, "/rail", i);
    auto mesh = tcp::TcpMesh::Connect(*store, h, layout.num_hosts(), mesh_options);
    if (!mesh.ok()) return b->FailRail(mesh.status());
    b->rail_ = *std::move(mesh);
  }
  mesh_options.group_key = absl::StrCat(options.shm.group_name, "/flat");
  auto flat = tcp::TcpMesh::Connect(*store, rank, size, mesh_options);
  if (!flat.ok()) return b->FailFlat(flat.status());
  b->flat_ = *std::move(flat);
  return b;
}

HierarchicalBackend::HierarchicalBackend(int rank, int size, HostLayout layout,
                                         std::string group_name,
                                         const HierarchicalOptions& options)
    : rank_(rank),
      size_(size),
      layout_(std::move(layout)),
      host_(layout_.host_of_rank[rank]),
      group_name_(std::move(group_name)),
      small_allreduce_bytes_(options.small_allreduce_bytes),
      multi_rail_min_bytes_(options.multi_rail_min_bytes),
      rail_chunk_bytes_(std::max<int64_t>(1, options.rail_chunk_bytes)),
      uniform_(Uniform(layout_)) {}

int64_t HierarchicalBackend::HostMajorPos(int r) const {
  int64_t pos = 0;
  for (int h = 0; h < layout_.host_of_rank[r]; ++h) pos += layout_.hosts[h].size();
  return pos + layout_.local_index[r];
}

absl::Status HierarchicalBackend::poison_status() const {
  absl::MutexLock lock(&mu_);
  return poison_;
}

absl::Status HierarchicalBackend::Poison(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (!poison_.ok()) return poison_;
    poison_ = std::move(status);
  }
  const absl::Status p = poison_status();
  if (local_) (void)local_->Poison(p);
  if (rail_) rail_->Abort(p.message());
  if (flat_) flat_->Abort(p.message());
  return p;
}

void HierarchicalBackend::Abort(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (poison_.ok()) poison_ = status;
  }
  if (local_) local_->RequestAbort(status);
  if (rail_) rail_->Abort(status.message());
  if (flat_) flat_->Abort(status.message());
}

absl::Status HierarchicalBackend::FailLocal(const absl::Status& s) {
  return Poison(WithPrefix(
      s, absl::StrCat("[group '", group_name_, "' rank ", rank_, ", shm on host ", host_,
                      " of ", layout_.num_hosts(), " (group ranks ",
                      HostRanks(layout_, host_), ")] ")));
}

absl::Status HierarchicalBackend::FailRail(const absl::Status& s) {
  // The mesh numbers hosts; spell out which group ranks each one stands for.
  const int i = layout_.local_index[rank_];
  std::vector<std::string> map;
  for (int h = 0; h < layout_.num_hosts(); ++h) {
    map.push_back(absl::StrCat("mesh rank ", h, " = host ", h, " (", i == 0 ? "leader " : "",
                               "group rank ", layout_.hosts[h][i], ", ranks ",
                               HostRanks(layout_, h), ")"));
  }
  const std::string which =
      i == 0 ? "host leaders" : absl::StrCat("local rank ", i, " of every host (rail ", i, ")");
  return Poison(WithPrefix(s, absl::StrCat("[group '", group_name_, "' rank ", rank_,
                                           ", inter-host TCP among ", which, "; ",
                                           absl::StrJoin(map, ", "), "] ")));
}

absl::Status HierarchicalBackend::FailFlat(const absl::Status& s) {
  return Poison(WithPrefix(s, absl::StrCat("[group '", group_name_, "' rank ", rank_,
                                           ", TCP mesh over all ranks] ")));
}

absl::Status HierarchicalBackend::CheckRail(const OpSpec& spec, const OpHeader& mine) {
  const int hosts = layout_.num_hosts();
  std::vector<OpHeader> all(hosts);
  all[host_] = mine;
  absl::Span<uint8_t> bytes(reinterpret_cast<uint8_t*>(all.data()), hosts * sizeof(OpHeader));
  if (absl::Status s = tcp::RingAllGather(*rail_, bytes, spec.ctx.deadline()); !s.ok()) {
    return FailRail(s);
  }
  bool agree = true;
  for (int h = 0; h < hosts && agree; ++h) agree = HeadersAgree(mine, all[h]);
  if (agree) return absl::OkStatus();
  std::vector<std::string> lines;
  for (int h = 0; h < hosts; ++h) {
    lines.push_back(absl::StrCat("host ", h, " (ranks ", HostRanks(layout_, h),
                                 "): ", DescribeHeader(all[h])));
  }
  return Poison(absl::InvalidArgumentError(absl::StrCat(
      spec.ctx.name, " on rank ", rank_, " of group '", group_name_,
      "': hosts called mismatched collectives: ", absl::StrJoin(lines, "; "))));
}

absl::Status HierarchicalBackend::CheckFlat(const OpSpec& spec, const OpHeader& mine,
                                            absl::Span<const int64_t> send,
                                            absl::Span<const int64_t> recv) {
  // Block per rank: header, then W send counts, then W receive counts.
  const size_t block = sizeof(OpHeader) + 2 * size_ * sizeof(int64_t);
  std::vector<uint8_t> all(block * size_, 0);
  uint8_t* own = all.data() + block * rank_;
  std::memcpy(own, &mine, sizeof(OpHeader));
  auto* counts = reinterpret_cast<int64_t*>(own + sizeof(OpHeader));
  for (int r = 0; r < size_; ++r) {
    counts[r] = send.empty() ? 0 : send[r];
    counts[size_ + r] = recv.empty() ? 0 : recv[r];
  }
  // Every rank's block straight from every rank, all at once (one round;
  // a ring all-gather would take W-1 dependent steps, each a scheduling
  // round trip when ranks outnumber cores).
  std::vector<tcp::SendBlock> sends;
  std::vector<tcp::RecvBlock> recvs;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    sends.push_back({r, absl::Span<const uint8_t>(own, block)});
    recvs.push_back({r, absl::Span<uint8_t>(all.data() + block * r, block)});
  }
  if (absl::Status s = flat_->Exchange(sends, recvs, spec.ctx.deadline()); !s.ok()) {
    return FailFlat(s);
  }
  auto header_of = [&](int r) {
    OpHeader h;
    std::memcpy(&h, all.data() + block * r, sizeof(OpHeader));
    return h;
  };
  auto count_of = [&](int r, int i) {
    int64_t v;
    std::memcpy(&v, all.data() + block * r + sizeof(OpHeader) + i * sizeof(int64_t),
                sizeof(v));
    return v;
  };
  bool agree = true;
  for (int r = 0; r < size_ && agree; ++r) agree = HeadersAgree(mine, header_of(r));
  if (!agree) {
    std::vector<std::string> lines;
    for (int r = 0; r < size_; ++r) {
      lines.push_back(absl::StrCat("rank ", r, ": ", DescribeHeader(header_of(r))));
    }
    return Poison(absl::InvalidArgumentError(absl::StrCat(
        spec.ctx.name, " on rank ", rank_, " of group '", group_name_,
        "': ranks called mismatched collectives: ", absl::StrJoin(lines, "; "))));
  }
  std::vector<std::string> bad;
  for (int i = 0; i < size_; ++i) {
    for (int j = 0; j < size_; ++j) {
      const int64_t sent = count_of(i, j), expected = count_of(j, size_ + i);
      if (sent != expected) {
        bad.push_back(absl::StrCat("rank ", i, " sends ", sent, " bytes to rank ", j,
                                   ", which expects ", expected));
      }
    }
  }
  if (bad.empty()) return absl::OkStatus();
  return Poison(absl::InvalidArgumentError(absl::StrCat(
      spec.ctx.name, " on rank ", rank_, " of group '", group_name_,
      "': split sizes disagree: ", absl::StrJoin(bad, "; "))));
}

absl::Status HierarchicalBackend::FlatAllToAll(const OpSpec& spec,
                                               const std::vector<uint8_t>& input,
                                               const std::vector<size_t>& send,
                                               std::vector<uint8_t>* output,
                                               const std::vector<size_t>& recv) {
  absl::Status s = tcp::AllToAll(*flat_, input, send, absl::MakeSpan(*output), recv,
                                 spec.ctx.deadline());
  return s.ok() ? s : FailFlat(s);
}

absl::Status HierarchicalBackend::AllReduceCore(const OpSpec& spec, OpKind header_kind,
                                                ReduceKind op, int root, int bcast_host,
                                                void* data) {
  if (absl::Status p = poison_status(); !p.ok()) return p;
  const size_t es = ElementSize(spec.dtype);
  const int64_t bytes = spec.count * static_cast<int64_t>(es);
  const ReduceKind wire_op = op == ReduceKind::kAvg ? ReduceKind::kSum : op;
  if (local_size() > 1) {
    if (absl::Status s = shm::Reduce(*local_, spec, wire_op, 0, data); !s.ok()) {
      return FailLocal(s);
    }
  }
  if (leader()) {
    const OpHeader mine = MakeHeader(spec, header_kind, op, root, true);
    if (absl::Status s = CheckRail(spec, mine); !s.ok()) return s;
    absl::Status s = tcp::RingAllReduce(
        *rail_, absl::Span<uint8_t>(static_cast<uint8_t*>(data), bytes), es,
        MakeReduceFn(spec.dtype, wire_op), spec.ctx.deadline());
    if (!s.ok()) return FailRail(s);
    if (op == ReduceKind::kAvg) DivideInPlace(spec.dtype, data, spec.count, size_);
  }
  if (local_size() > 1 && (bcast_host < 0 || bcast_host == host_)) {
    if (absl::Status s = shm::Broadcast(*local_, spec, 0, data, bytes); !s.ok()) {
      return FailLocal(s);
    }
  }
  return absl::OkStatus();
}

absl::Status HierarchicalBackend::AllReduce(const OpSpec& spec, ReduceKind op, void* data) {
  if (MultiRail(spec.count * static_cast<int64_t>(ElementSize(spec.dtype)), spec.count)) {
    if (absl::Status p = poison_status(); !p.ok()) return p;
    return AllReduceRails(spec, op, data);
  }
  return AllReduceCore(spec, OpKind::kAllreduce, op, -1, -1, data);
}

absl::Status HierarchicalBackend::Reduce(const OpSpec& spec, ReduceKind op, int root,
                                         void* data) {
  const int64_t bytes = spec.count * static_cast<int64_t>(ElementSize(spec.dtype));
  std::vector<uint8_t> tmp(static_cast<const uint8_t*>(data),
                           static_cast<const uint8_t*>(data) + bytes);
  absl::Status s = AllReduceCore(spec, OpKind::kReduce, op, root,
                                 layout_.host_of_rank[root], tmp.data());
  if (s.ok() && rank_ == root && bytes > 0) std::memcpy(data, tmp.data(), bytes);
  return s;
}

absl::Status HierarchicalBackend::ReduceScatter(const OpSpec& spec, ReduceKind op,
                                                absl::Span<const void* const> inputs,
                                                void* out) {
  if (absl::Status p = poison_status(); !p.ok()) return p;
  const size_t es = ElementSize(spec.dtype);
  const int64_t bytes = spec.count * static_cast<int64_t>(es);
  if (MultiRail(bytes * size_, spec.count * local_size())) {
    return ReduceScatterRails(spec, op, inputs, out);
  }
  const ReduceKind wire_op = op == ReduceKind::kAvg ? ReduceKind::kSum : op;
  // Host-padded layout: host h's block starts at h * max_n * bytes and holds
  // the inputs for its ranks by local index (equal blocks for the ring).
  int64_t max_n = 0;
  for (const auto& h : layout_.hosts) max_n = std::max<int64_t>(max_n, h.size());
  const int64_t block = max_n * bytes;
  std::vector<uint8_t> buf(std::max<int64_t>(1, block * layout_.num_hosts()), 0);
  auto slot = [&](int r) {
    return buf.data() + layout_.host_of_rank[r] * block + layout_.local_index[r] * bytes;
  };
  for (int r = 0; r < size_ && bytes > 0; ++r) std::memcpy(slot(r), inputs[r], bytes);
  OpSpec whole = spec;  // the local reduce covers every host's block
  whole.count = spec.count * max_n * layout_.num_hosts();
  whole.shape = {whole.count};
  if (local_size() > 1) {
    if (absl::Status s = shm::Reduce(*local_, whole, wire_op, 0, buf.data()); !s.ok()) {
      return FailLocal(s);
    }
  }
  uint8_t* mine = buf.data() + host_ * block;
  if (leader()) {
    const OpHeader header = MakeHeader(spec, OpKind::kReduceScatter, op, -1, true);
    if (absl::Status s = CheckRail(spec, header); !s.ok()) return s;
    absl::Status s = tcp::RingReduceScatter(
        *rail_, absl::Span<uint8_t>(buf.data(), block * layout_.num_hosts()), es,
        MakeReduceFn(spec.dtype, wire_op), spec.ctx.deadline());
    if (!s.ok()) return FailRail(s);
    if (op == ReduceKind::kAvg) {
      DivideInPlace(spec.dtype, mine, spec.count * local_size(), size_);
    }
  }
  if (local_size() > 1) {
    std::vector<const void*> pieces(local_size());
    for (int i = 0; i < local_size(); ++i) pieces[i] = mine + i * bytes;
    std::vector<uint8_t> piece(std::max<int64_t>(1, bytes));
    if (absl::Status s = shm::Scatter(*local_, spec, 0, pieces, piece.data(), bytes); !s.ok()) {
      return FailLocal(s);
    }
    if (bytes > 0) std::memcpy(out, piece.data(), bytes);
  } else if (bytes > 0) {
    std::memcpy(out, mine, bytes);
  }
  return absl::OkStatus();
}

absl::Status HierarchicalBackend::AllGather(const OpSpec& spec, const void* in,
                                            int64_t bytes, absl::Span<void* const> outs) {
  if (absl::Status p = poison_status(); !p.ok()) return p;
  if (MultiRail(bytes * size_, bytes * local_size())) {
    return AllGatherRails(spec, in, bytes, outs);
  }
  std::vector<uint8_t> buf(std::max<int64_t>(1, bytes * size_));  // host-major blocks
  const int64_t base = HostMajorPos(layout_.hosts[host_][0]);
  if (local_size() > 1) {
    std::vector<void*> local_outs(local_size());
    for (int i = 0; i < local_size(); ++i) local_outs[i] = buf.data() + (base + i) * bytes;
    if (absl::Status s = shm::Gather(*local_, spec, 0, in, bytes, local_outs); !s.ok()) {
      return FailLocal(s);
    }
  } else if (bytes > 0) {
    std::memcpy(buf.data() + base * bytes, in, bytes);
  }
  if (leader()) {
    const OpHeader mine = MakeHeader(spec, OpKind::kAllgather, ReduceKind{}, -1, true);
    if (absl::Status s = CheckRail(spec, mine); !s.ok()) return s;
    std::vector<size_t> blocks(layout_.num_hosts());
    for (int h = 0; h < layout_.num_hosts(); ++h) blocks[h] = layout_.hosts[h].size() * bytes;
    absl::Status s = tcp::RingAllGatherV(
        *rail_, absl::Span<uint8_t>(buf.data(), bytes * size_), blocks, spec.ctx.deadline());
    if (!s.ok()) return FailRail(s);
  }
  if (local_size() > 1) {
    if (absl::Status s = shm::Broadcast(*local_, spec, 0, buf.data(), bytes * size_); !s.ok()) {
      return FailLocal(s);
    }
  }
  for (int r = 0; r < size_ && bytes > 0; ++r) {
    std::memmove(outs[r], buf.data() + HostMajorPos(r) * bytes, bytes);
  }
  return absl::OkStatus();
}

absl::Status HierarchicalBackend::Broadcast(const OpSpec& spec, int root, void* data,
                                            int64_t bytes) {
  if (absl::Status p = poison_status(); !p.ok()) return p;
  if (MultiRail(bytes, bytes)) return BroadcastRails(spec, root, data, bytes);
  const int root_host = layout_.host_of_rank[root];
  if (host_ == root_host && local_size() > 1) {
    absl::Status s = shm::Broadcast(*local_, spec, layout_.local_index[root], data, bytes);
    if (!s.ok()) return FailLocal(s);
  }
  if (leader()) {
    const OpHeader mine = MakeHeader(spec, OpKind::kBroadcast, ReduceKind{}, root, true);
    if (absl::Status s = CheckRail(spec, mine); !s.ok()) return s;
    absl::Status s = tcp::RingBroadcast(
        *rail_, root_host, absl::Span<uint8_t>(static_cast<uint8_t*>(data), bytes),
        spec.ctx.deadline());
    if (!s.ok()) return FailRail(s);
  }
  if (host_ != root_host && local_size() > 1) {
    if (absl::Status s = shm::Broadcast(*local_, spec, 0, data, bytes); !s.ok()) {
      return FailLocal(s);
    }
  }
  return absl::OkStatus();
}

absl::Status HierarchicalBackend::Barrier(const OpSpec& spec) {
  if (absl::Status p = poison_status(); !p.ok()) return p;
  if (local_size() > 1) {
    if (absl::Status s = shm::Barrier(*local_, spec); !s.ok()) return FailLocal(s);
  }
  if (leader()) {
    const OpHeader mine = MakeHeader(spec, OpKind::kBarrier, ReduceKind{}, -1, true);
    if (absl::Status s = CheckRail(spec, mine); !s.ok()) return s;
  }
  if (local_size() > 1) {
    if (absl::Status s = shm::Barrier(*local_, spec); !s.ok()) return FailLocal(s);
  }
  return absl::OkStatus();
}

absl::Status HierarchicalBackend::Gather(const OpSpec& spec, int root, const void* in,
                                         int64_t bytes, absl::Span<void* const> outs) {
  if (absl::Status p = poison_status(); !p.ok()) return p;
  std::vector<int64_t> send(size_, 0), recv(size_, 0);
  send[root] = bytes;
  if (rank_ == root) std::fill(recv.begin(), recv.end(), bytes);
  const OpHeader mine = MakeHeader(spec, OpKind::kGather, ReduceKind{}, root, true);
  if (absl::Status s = CheckFlat(spec, mine, send, recv); !s.ok()) return s;
  std::vector<uint8_t> input(static_cast<const uint8_t*>(in),
                             static_cast<const uint8_t*>(in) + bytes);
  std::vector<uint8_t> output(rank_ == root ? bytes * size_ : 0);
  std::vector<size_t> send_u(send.begin(), send.end()), recv_u(recv.begin(), recv.end());
  if (absl::Status s = FlatAllToAll(spec, input, send_u, &output, recv_u); !s.ok()) return s;
  for (int r = 0; rank_ == root && r < size_ && bytes > 0; ++r) {
    std::memcpy(outs[r], output.data() + r * bytes, bytes);
  }
  return absl::OkStatus();
}

absl::Status HierarchicalBackend::Scatter(const OpSpec& spec, int root,
                                          absl::Span<const void* const> ins, void* out,
                                          int64_t bytes) {
  if (absl::Status p = poison_status(); !p.ok()) return p;
  std::vector<int64_t> send(size_, 0), recv(size_, 0);
  recv[root] = bytes;
  if (rank_ == root) std::fill(send.begin(), send.end(), bytes);
  const OpHeader mine = MakeHeader(spec, OpKind::kScatter, ReduceKind{}, root, true);
  if (absl::Status s = CheckFlat(spec, mine, send, recv); !s.ok()) return s;
  std::vector<uint8_t> input(rank_ == root ? bytes * size_ : 0);
  for (int r = 0; rank_ == root && r < size_ && bytes > 0; ++r) {
    std::memcpy(input.data() + r * bytes, ins[r], bytes);
  }
  std::vector<uint8_t> output(bytes);
  std::vector<size_t> send_u(send.begin(), send.end()), recv_u(recv.begin(), recv.end());
  if (absl::Status s = FlatAllToAll(spec, input, send_u, &output, recv_u); !s.ok()) return s;
  if (bytes > 0) std::memcpy(out, output.data(), bytes);
  return absl::OkStatus();
}

}  // namespace tpudist::collectives
