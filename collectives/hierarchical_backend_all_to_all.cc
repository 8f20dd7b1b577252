// HierarchicalBackend::AllToAll (the rest of the backend is in
// hierarchical_backend.cc).
//
// Every rank first all-gathers {header, its send and receive byte counts}
// over the flat mesh (CheckFlat, one round of TcpMesh::Exchange): headers and every pair's sizes are checked
// on every rank before any data moves. Then each rank moves its blocks in
// three parts, none through a leader and none through a staging buffer:
//   * its own block: one memcpy from its input block to its output block;
//   * blocks for the other ranks of its host: shm::AllToAll on the host's
//     communicator (its own block passed as empty, so it is not copied
//     through a slot twice);
//   * blocks for ranks of other hosts: tcp::PairwiseExchange over the flat
//     mesh, sent from and received into the caller's blocks directly.
// The shm and TCP parts depend on disjoint sets of peers (the host's ranks,
// which all run the same shm part; the other hosts' ranks, which all run the
// same TCP part), so when both are large they run at once, the shm part on a
// helper thread: memory copies overlap the network. Neither part can wait on
// the other, so this adds no deadlock. A failure in one part aborts the
// other (RequestAbort on the communicator / Abort on the mesh, both
// thread-safe), and after the join the backend is poisoned with the error of
// the part that failed first (the other one only saw that abort).
#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "collectives/hierarchical_backend.h"
#include "collectives/shm/algorithms.h"
#include "collectives/tcp/pairwise_exchange.h"

namespace tpudist::collectives {
namespace {

// Below this many bytes in either part, a helper thread costs more than the
// overlap gains: run the parts one after the other.
constexpr int64_t kOverlapMinBytes = 256 << 10;

}  // namespace

absl::Status HierarchicalBackend::LocalAllToAll(const OpSpec& spec,
                                                absl::Span<const void* const> ins,
                                                absl::Span<const int64_t> in_bytes,
                                                absl::Span<void* const> outs,
                                                absl::Span<const int64_t> out_bytes) {
  const std::vector<int>& locals = layout_.hosts[host_];
  std::vector<const void*> local_ins;
  std::vector<void*> local_outs;
  std::vector<int64_t> local_in_bytes, local_out_bytes;
  for (int r : locals) {
    local_ins.push_back(ins[r]);
    local_in_bytes.push_back(r == rank_ ? 0 : in_bytes[r]);
    local_outs.push_back(outs[r]);
    local_out_bytes.push_back(r == rank_ ? 0 : out_bytes[r]);
  }
  return shm::AllToAll(*local_, spec, local_ins, local_in_bytes, local_outs, local_out_bytes);
}

absl::Status HierarchicalBackend::RemoteAllToAll(const OpSpec& spec,
                                                 absl::Span<const void* const> ins,
                                                 absl::Span<const int64_t> in_bytes,
                                                 absl::Span<void* const> outs,
                                                 absl::Span<const int64_t> out_bytes) {
  std::vector<absl::Span<const uint8_t>> send(size_);
  std::vector<absl::Span<uint8_t>> recv(size_);
  std::unique_ptr<bool[]> remote(new bool[size_]);
  for (int r = 0; r < size_; ++r) {
    remote[r] = layout_.host_of_rank[r] != host_;
    send[r] = absl::Span<const uint8_t>(static_cast<const uint8_t*>(ins[r]), in_bytes[r]);
    recv[r] = absl::Span<uint8_t>(static_cast<uint8_t*>(outs[r]), out_bytes[r]);
  }
  return tcp::PairwiseExchange(*flat_, send, recv, absl::MakeConstSpan(remote.get(), size_),
                               spec.ctx.deadline());
}

absl::Status HierarchicalBackend::AllToAll(const OpSpec& spec,
                                           absl::Span<const void* const> ins,
                                           absl::Span<const int64_t> in_bytes,
                                           absl::Span<void* const> outs,
                                           absl::Span<const int64_t> out_bytes) {
  if (absl::Status p = poison_status(); !p.ok()) return p;
  const OpHeader mine = MakeHeader(spec, OpKind::kAlltoall, ReduceKind{}, -1, false);
  if (absl::Status s = CheckFlat(spec, mine, in_bytes, out_bytes); !s.ok()) return s;
  if (in_bytes[rank_] > 0) std::memcpy(outs[rank_], ins[rank_], in_bytes[rank_]);
  int64_t local_bytes = 0, remote_bytes = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    (layout_.host_of_rank[r] == host_ ? local_bytes : remote_bytes) += in_bytes[r] + out_bytes[r];
  }
  // local_size() is the same on every rank of a host, so all or none of its
  // ranks call shm::AllToAll; whether to overlap is each rank's own choice
  // (it changes no message).
  if (local_size() == 1) {
    absl::Status s = RemoteAllToAll(spec, ins, in_bytes, outs, out_bytes);
    return s.ok() ? s : FailFlat(s);
  }
  if (local_bytes < kOverlapMinBytes || remote_bytes < kOverlapMinBytes) {
    if (absl::Status s = LocalAllToAll(spec, ins, in_bytes, outs, out_bytes); !s.ok()) {
      return FailLocal(s);
    }
    absl::Status s = RemoteAllToAll(spec, ins, in_bytes, outs, out_bytes);
    return s.ok() ? s : FailFlat(s);
  }
  // Which part failed first (0: neither yet, 1: shm, 2: TCP): the other
  // part's error is then only the abort it was sent.
  std::atomic<int> first_failure{0};
  absl::Status local_status;
  std::thread local_part([&] {
    local_status = LocalAllToAll(spec, ins, in_bytes, outs, out_bytes);
    int none = 0;
    if (!local_status.ok() && first_failure.compare_exchange_strong(none, 1)) {
      flat_->Abort(local_status.message());
    }
  });
  const absl::Status remote_status = RemoteAllToAll(spec, ins, in_bytes, outs, out_bytes);
  int none = 0;
  if (!remote_status.ok() && first_failure.compare_exchange_strong(none, 2)) {
    local_->RequestAbort(remote_status);
  }
  local_part.join();
  if (first_failure.load() == 1) return FailLocal(local_status);
  if (first_failure.load() == 2) return FailFlat(remote_status);
  return absl::OkStatus();
}

}  // namespace tpudist::collectives
