// SliceBackend: the collectives of a group whose ranks span several slices
// (HostLayout::num_slices() > 1, every slice holding the same number L of the
// group's ranks). Three link classes, each used for what it is good at:
//
//   * inside a slice: the slice's own backend over its L ranks (ShmBackend
//     when they share a host, else HierarchicalBackend: shm inside a host,
//     TCP between the slice's hosts, the ICI stand-in);
//   * DCN: one TcpMesh per in-slice position p among the ranks at position p
//     of every slice (mesh rank = slice index), so every rank has exactly one
//     connection to each other slice and all L meshes run in parallel;
//   * the whole group: a HierarchicalBackend over all hosts (every host a
//     peer), for the ops that do not decompose by slice.
//
// Which op goes where (prose in slice_backend.cc):
//   allreduce: reduce-scatter inside the slice (rank at position p keeps
//     shard p, ceil(count / L) elements, zero-padded), all-reduce of the
//     shard across slices over DCN mesh p, all-gather inside the slice; each
//     rank moves 2 (S-1)/S x count/L elements over DCN (a flat ring over all
//     W ranks: 2 (W-1)/W x count), i.e. 1/L of a flat ring's DCN bytes.
//   reduce_scatter: inside the slice, reduce-scatter of the blocks ordered
//     (position, slice), then a ring reduce-scatter of the S blocks over DCN.
//   allgather: ring all-gather of the S inputs of one position over DCN,
//     then all-gather of those S-block buffers inside the slice.
//   everything else: the whole-group backend.
// Cross-slice mismatches are caught by an all-gather of the op headers on
// each DCN mesh before its data moves; inside a slice by its backend. Any
// error poisons all three.
//
// Ownership: owns its backends and meshes; the store is used only during
// Create. Thread-safety: as CollectiveBackend.
#ifndef TPU_DIST_COLLECTIVES_SLICE_BACKEND_H_
#define TPU_DIST_COLLECTIVES_SLICE_BACKEND_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "collectives/collective_backend.h"
#include "collectives/hierarchical_backend.h"
#include "collectives/host_layout.h"
#include "collectives/tcp/tcp_mesh.h"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace tpudist::collectives {

// Every member publishes "place/<rank>" = (slice id, host id) in `store`
// (the group's namespaced store) and reads everyone's, waiting up to
// `timeout` per key: the group's layout, from its members' placement only.
// slice_id < 0 (unknown) counts as slice 0. Throws the store's errors
// (c10::Error), as the process group's constructor does.
HostLayout ExchangePlacement(c10d::Store& store, int rank, int size,
                             const std::string& host_id, int slice_id,
                             std::chrono::milliseconds timeout);

// The backend for a group on several hosts: SliceBackend when the layout
// spans slices of equal size, else HierarchicalBackend.
absl::StatusOr<std::unique_ptr<CollectiveBackend>> CreateMultiHostBackend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const HostLayout& layout, const HierarchicalOptions& options);

class SliceBackend final : public CollectiveBackend {
 public:
  // Collective over `store`. REQUIRES: layout.num_slices() > 1 and
  // layout.uniform_slices(); layout.host_of_rank.size() == size.
  static absl::StatusOr<std::unique_ptr<SliceBackend>> Create(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
      const HostLayout& layout, const HierarchicalOptions& options);

  int size() const override { return size_; }
  absl::Status AllReduce(const OpSpec& spec, ReduceKind op, void* data) override;
  absl::Status Reduce(const OpSpec& spec, ReduceKind op, int root, void* data) override;
  absl::Status ReduceScatter(const OpSpec& spec, ReduceKind op,
                             absl::Span<const void* const> inputs, void* out) override;
  absl::Status AllGather(const OpSpec& spec, const void* in, int64_t bytes,
                         absl::Span<void* const> outs) override;
  absl::Status Broadcast(const OpSpec& spec, int root, void* data, int64_t bytes) override;
  absl::Status Gather(const OpSpec& spec, int root, const void* in, int64_t bytes,
                      absl::Span<void* const> outs) override;
  absl::Status Scatter(const OpSpec& spec, int root, absl::Span<const void* const> ins,
                       void* out, int64_t bytes) override;
  absl::Status AllToAll(const OpSpec& spec, absl::Span<const void* const> ins,
                        absl::Span<const int64_t> in_bytes, absl::Span<void* const> outs,
                        absl::Span<const int64_t> out_bytes) override;
  absl::Status Barrier(const OpSpec& spec) override;
  absl::Status Poison(absl::Status status) override;
  absl::Status poison_status() const override;
  void Abort(const absl::Status& status) override;
  shm::Communicator* local_communicator() const override {
    return whole_->local_communicator();
  }

 private:
  SliceBackend(int rank, int size, const HostLayout& layout, std::string group_name);

  int slice_size() const { return static_cast<int>(layout_.slices[slice_].size()); }
  // All-gathers the op header over the DCN mesh and checks every slice
  // called the same op (poisons and names each slice's call otherwise).
  absl::Status CheckDcn(const OpSpec& spec, const OpHeader& mine);
  // The in-slice op `spec` with `count` elements of spec.dtype.
  OpSpec InnerSpec(const OpSpec& spec, int64_t count) const;
  absl::Status FailDcn(const absl::Status& s);
  absl::Status FailInner(const absl::Status& s);

  const int rank_;
  const int size_;
  const HostLayout layout_;
  const int slice_;     // this rank's slice (DCN mesh rank)
  const int position_;  // this rank's in-slice position (its DCN mesh)
  const std::string group_name_;
  std::unique_ptr<CollectiveBackend> whole_;
  std::unique_ptr<CollectiveBackend> inner_;  // null when L == 1
  std::unique_ptr<tcp::TcpMesh> dcn_;
  std::vector<uint8_t> scratch_;
  std::vector<uint8_t> shard_;
  mutable absl::Mutex mu_;
  absl::Status poison_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_SLICE_BACKEND_H_
