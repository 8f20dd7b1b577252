// HierarchicalBackend: the collectives of a group whose ranks span several
// hosts. Inside a host the ranks share one shm::Communicator (local ranks =
// HostLayout::local_index, any subset of group ranks, not necessarily
// contiguous); between hosts the backend uses TCP (collectives/tcp):
//
//   * rail meshes: rail i is a TcpMesh among local rank i of every host
//     (mesh rank h = hosts[h][i]). Rail 0 is the host leaders' mesh and
//     always exists; rails 1.. exist only when every host has the same
//     number of ranks ("uniform" layout), and every rank is on one rail;
//   * flat mesh: a TcpMesh over all group ranks (mesh rank = group rank),
//     for the ops that do not decompose into host blocks.
//
// Which op goes where (prose in hierarchical_backend.cc and
// hierarchical_backend_rails.cc):
//   allreduce, reduce_scatter, broadcast, allgather of at least
//     options.multi_rail_min_bytes on a uniform layout with >= 2 ranks per
//     host: multi-rail (intra-host shm step that leaves local rank i with
//     its 1/n of the payload -> every rail over TCP at once -> intra-host
//     shm step); each rail exchanges op headers first.
//   otherwise (small messages, hosts of different sizes) and reduce,
//   barrier: the leaders path (intra-host shm step -> leaders over TCP ->
//     intra-host shm step); leaders exchange op headers over rail 0 first.
//   gather, scatter: flat mesh (every rank exchanges its header and split
//     sizes with every rank, then tcp::AllToAll).
//   alltoall: the same header/split exchange, then shm::AllToAll among a
//     host's ranks and tcp::PairwiseExchange of the cross-host blocks over
//     the flat mesh, each rank with its peers directly.
//
// Errors: cross-rank mismatches are detected inside a host by the shm headers
// and across hosts by the leaders' (or flat) header exchange; the message
// lists each host's (or rank's) call. A dead or failed rank shows up locally
// through shm (pid checks, abort words) and remotely as a TCP error; either
// poisons the backend: its shm communicator is aborted (local peers fail with
// the reason) and its meshes are shut down (remote peers fail promptly).
// Messages name group ranks; shm and leaders-mesh messages carry a prefix
// that maps their local numbering to group ranks.
//
// Ownership: owns the communicator and the meshes; the store is used only
// during Create. Thread-safety: as CollectiveBackend.
#ifndef TPU_DIST_COLLECTIVES_HIERARCHICAL_BACKEND_H_
#define TPU_DIST_COLLECTIVES_HIERARCHICAL_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "collectives/collective_backend.h"
#include "collectives/core/op_header.h"
#include "collectives/hierarchical_backend_pipeline.h"
#include "collectives/host_layout.h"
#include "collectives/shm/communicator.h"
#include "collectives/tcp/tcp_mesh.h"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace tpudist::collectives {

struct HierarchicalOptions {
  shm::CommOptions shm;            // group_name is suffixed per host
  int64_t small_allreduce_bytes = 32 << 10;  // as ProcessGroupTpuDist::Options
  std::string bind_address;        // numeric, see ResolveBindAddress
  std::string advertise_address;   // "" = bind_address
  std::string job_secret;          // bytes; "" = TCP connections unauthenticated
  absl::Duration connect_timeout = absl::Minutes(5);
  // allreduce / reduce_scatter / allgather / broadcast payloads (the
  // largest buffer a rank touches) of at least this many bytes take the
  // multi-rail path when the layout is uniform; smaller ones, where the
  // extra shm steps cost more than the parallel rails gain, the leaders path.
  int64_t multi_rail_min_bytes = 2 << 20;
  // Multi-rail ops are cut into chunks of about this many bytes (of the
  // largest per-rank buffer) so that the shm steps of one chunk overlap the
  // TCP step of another (hierarchical_backend_pipeline.h); >= the payload:
  // one chunk, the steps one after the other. All-reduce uses half of it
  // (its TCP step is a reduce-scatter plus an all-gather).
  int64_t rail_chunk_bytes = 4 << 20;
};

class HierarchicalBackend final : public CollectiveBackend {
 public:
  // Collective over `store` (the group's namespaced store): every rank of
  // the group calls it with the same layout.
  // REQUIRES: layout.host_of_rank.size() == size, 0 <= rank < size.
  static absl::StatusOr<std::unique_ptr<HierarchicalBackend>> Create(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
      const HostLayout& layout, const HierarchicalOptions& options);

  int size() const override { return size_; }
  absl::Status AllReduce(const OpSpec& spec, ReduceKind op, void* data) override;
  absl::Status Reduce(const OpSpec& spec, ReduceKind op, int root,
                      void* data) override;
  absl::Status ReduceScatter(const OpSpec& spec, ReduceKind op,
                             absl::Span<const void* const> inputs, void* out) override;
  absl::Status AllGather(const OpSpec& spec, const void* in, int64_t bytes,
                         absl::Span<void* const> outs) override;
  absl::Status Broadcast(const OpSpec& spec, int root, void* data,
                         int64_t bytes) override;
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
  shm::Communicator* local_communicator() const override { return local_.get(); }

 private:
  HierarchicalBackend(int rank, int size, HostLayout layout, std::string group_name,
                      const HierarchicalOptions& options);

  bool leader() const { return layout_.local_index[rank_] == 0; }
  int local_size() const { return static_cast<int>(layout_.hosts[host_].size()); }
  // Whether an op whose largest per-rank buffer is `bytes` (and whose
  // payload splits into `units` >= local_size() pieces) takes the
  // multi-rail path. The same on every rank for matching calls.
  bool MultiRail(int64_t bytes, int64_t units) const {
    return uniform_ && local_size() > 1 && bytes >= multi_rail_min_bytes_ &&
           units >= local_size();
  }
  // Index of rank r's block in host-major order (hosts in order, ranks of a
  // host by local index): the layout of the leaders' all-gather buffer.
  int64_t HostMajorPos(int r) const;

  // Reduce into the leader, leaders' ring all-reduce, then broadcast inside
  // the hosts in `bcast_hosts` (-1: every host). data: [count] in place.
  absl::Status AllReduceCore(const OpSpec& spec, OpKind header_kind,
                             ReduceKind op, int root, int bcast_host, void* data);
  // Ranks on a rail (leaders: rail 0): all-gathers the op headers over the
  // rail and checks that every host called the same op.
  absl::Status CheckRail(const OpSpec& spec, const OpHeader& mine);
  // The multi-rail ops (hierarchical_backend_rails.cc); same contracts as
  // the public ones. REQUIRES: MultiRail(...) of the op's size holds.
  absl::Status AllReduceRails(const OpSpec& spec, ReduceKind op, void* data);
  absl::Status ReduceScatterRails(const OpSpec& spec, ReduceKind op,
                                  absl::Span<const void* const> inputs, void* out);
  absl::Status AllGatherRails(const OpSpec& spec, const void* in, int64_t bytes,
                              absl::Span<void* const> outs);
  absl::Status BroadcastRails(const OpSpec& spec, int root, void* data, int64_t bytes);
  // Runs the rails' chunk pipeline with this backend's abort hooks and
  // poisons it (FailLocal / FailRail) on failure.
  absl::Status RunRails(const OpSpec& spec, int64_t chunks, const RailStages& stages);
  // Every rank: all-gathers {header, send bytes [W], recv bytes [W]} over the
  // flat mesh (one Exchange round, every rank with every rank) and checks
  // headers and the split matrix.
  absl::Status CheckFlat(const OpSpec& spec, const OpHeader& mine,
                         absl::Span<const int64_t> send, absl::Span<const int64_t> recv);
  // All-to-all pieces (hierarchical_backend_all_to_all.cc). LocalAllToAll:
  // the blocks among this host's ranks other than this rank's own, through
  // shm; its errors are returned unwrapped (the caller poisons).
  // ins/outs: [W] caller blocks of in_bytes/out_bytes[r] bytes.
  absl::Status LocalAllToAll(const OpSpec& spec, absl::Span<const void* const> ins,
                             absl::Span<const int64_t> in_bytes, absl::Span<void* const> outs,
                             absl::Span<const int64_t> out_bytes);
  // The blocks for other hosts' ranks over the flat mesh; errors unwrapped.
  absl::Status RemoteAllToAll(const OpSpec& spec, absl::Span<const void* const> ins,
                              absl::Span<const int64_t> in_bytes, absl::Span<void* const> outs,
                              absl::Span<const int64_t> out_bytes);
  // Exchange over the flat mesh after CheckFlat.
  absl::Status FlatAllToAll(const OpSpec& spec, const std::vector<uint8_t>& input,
                            const std::vector<size_t>& send, std::vector<uint8_t>* output,
                            const std::vector<size_t>& recv);

  // Error wrappers: add the numbering prefix, then poison everything.
  absl::Status FailLocal(const absl::Status& s);
  absl::Status FailRail(const absl::Status& s);
  absl::Status FailFlat(const absl::Status& s);

  const int rank_;
  const int size_;
  const HostLayout layout_;
  const int host_;
  const std::string group_name_;
  const int64_t small_allreduce_bytes_;
  const int64_t multi_rail_min_bytes_;
  const int64_t rail_chunk_bytes_;
  const bool uniform_;  // every host has the same number of ranks
  std::unique_ptr<shm::Communicator> local_;
  std::unique_ptr<tcp::TcpMesh> rail_;  // leaders always; everyone if uniform_
  std::unique_ptr<tcp::TcpMesh> flat_;
  mutable absl::Mutex mu_;
  absl::Status poison_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_HIERARCHICAL_BACKEND_H_
