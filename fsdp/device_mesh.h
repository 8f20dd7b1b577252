// DeviceMesh: an n-D array of ranks with named dimensions and one cached
// c10d process group per mesh dimension that this rank belongs to (PyTorch
// 2.x init_device_mesh semantics, over any c10d::ProcessGroup).
//
//   DeviceMeshEnv env{rank, world_size, store, factory};
//   auto mesh = InitDeviceMesh("tpu", {2, 8}, {"dp", "tp"}, env);   // StatusOr
//   DeviceMesh tp = *mesh->Slice("tp");     // 1-D: this rank's tp group
//   tp.Group(0)->allreduce(...);
//
// Ranks are laid out row-major (last dim fastest): for {2, 8}, tp groups are
// {0..7} and {8..15}, dp groups {0, 8}, {1, 9}, ...
//
// Group creation: at InitDeviceMesh every rank creates, for each mesh dim, the
// one group along that dim it belongs to, through GroupFactory with a store
// prefixed by the mesh name, the dim and the group's ranks. Creation is
// collective among the members of each group, so all ranks must call
// InitDeviceMesh with the same arguments. Sub-meshes share the parent's
// groups: nothing is created twice.
//
// Thread-safety: a DeviceMesh is immutable after creation and cheap to copy
// (groups are shared). The process groups follow c10d rules: every member
// issues the same collectives in the same order.
#ifndef TPU_DIST_FSDP_DEVICE_MESH_H_
#define TPU_DIST_FSDP_DEVICE_MESH_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "tpu_runtime/rank_info.h"

namespace tpudist::fsdp {

// Creates the process group of `global_ranks` for the caller, whose index in
// it is `group_rank`. `store` is already prefixed for this group only.
// Works for Gloo (ProcessGroupGloo(store, group_rank, size)) and tpu_dist.
using GroupFactory = std::function<absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>>(
    const c10::intrusive_ptr<c10d::Store>& store, int group_rank,
    const std::vector<int>& global_ranks)>;

// Who this process is and how to reach the others.
struct DeviceMeshEnv {
  int rank = 0;
  int world_size = 1;
  c10::intrusive_ptr<c10d::Store> store;  // shared by all ranks
  GroupFactory group_factory;
  // Store key prefix; distinct meshes over one store need distinct names.
  std::string mesh_name = "device_mesh";
  // Deadline for every collective DTensor code issues on this mesh.
  absl::Duration collective_timeout = absl::Seconds(60);
};

class DeviceMesh {
 public:
  // Shape, names (may be empty: unnamed dims), flat row-major global ranks.
  int ndim() const { return static_cast<int>(shape_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<std::string>& dim_names() const { return dim_names_; }
  const std::vector<int>& ranks() const { return ranks_; }
  const std::string& device_type() const { return device_type_; }
  // Number of devices along `dim`; the product for size().
  // REQUIRES: 0 <= dim < ndim().
  int64_t size(int dim) const { return shape_[dim]; }
  int64_t size() const;

  // This process: global rank, coordinate in the mesh, index along `dim`
  // (its rank inside Group(dim)).
  int global_rank() const { return global_rank_; }
  const std::vector<int64_t>& coordinate() const { return coordinate_; }
  int64_t LocalRank(int dim) const { return coordinate_[dim]; }

  // Index of the dim called `name`; NotFound names the known dims.
  absl::StatusOr<int> DimIndex(absl::string_view name) const;

  // The group along `dim` through this rank; never null.
  // REQUIRES: 0 <= dim < ndim().
  const c10::intrusive_ptr<c10d::ProcessGroup>& Group(int dim) const { return groups_[dim]; }
  absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> Group(absl::string_view name) const;

  // The sub-mesh through this rank keeping the named dims in the given order
  // (mesh["tp"], mesh[("dp", "tp")]). Errors on unknown or repeated names.
  absl::StatusOr<DeviceMesh> Slice(absl::string_view name) const;
  absl::StatusOr<DeviceMesh> Slice(absl::Span<const std::string> names) const;

  absl::Duration collective_timeout() const { return timeout_; }
  std::chrono::milliseconds collective_timeout_ms() const {
    return std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_));
  }

  // "DeviceMesh(tpu, (dp=2, tp=8), rank 9 at (1, 1))".
  std::string ToString() const;

 private:
  friend absl::StatusOr<DeviceMesh> InitDeviceMesh(absl::string_view,
                                                   std::vector<int64_t>,
                                                   std::vector<std::string>,
                                                   const DeviceMeshEnv&);
  DeviceMesh() = default;

  std::string device_type_;
  std::vector<int64_t> shape_;
  std::vector<std::string> dim_names_;
  std::vector<int> ranks_;  // flat row-major global ranks
  int global_rank_ = 0;
  std::vector<int64_t> coordinate_;
  std::vector<c10::intrusive_ptr<c10d::ProcessGroup>> groups_;  // one per dim
  absl::Duration timeout_;
};

// Builds the mesh of ranks 0..world_size-1 shaped `shape` and creates its
// per-dim groups. InvalidArgument when the product differs from world_size,
// a size is < 1, names are duplicated/empty/miscounted, or env lacks a store
// or factory; a factory error is returned with the dim and ranks named.
absl::StatusOr<DeviceMesh> InitDeviceMesh(absl::string_view device_type,
                                          std::vector<int64_t> shape,
                                          std::vector<std::string> dim_names,
                                          const DeviceMeshEnv& env);

// Topology-aware (dp, tp) shape for a slice: {num_devices / tp, tp}. Ranks
// are host-major (rank = host * devices_per_host + local_rank), so with the
// last dim fastest a tp group stays inside one host exactly when tp divides
// devices_per_host; anything else is InvalidArgument naming the slice.
absl::StatusOr<std::vector<int64_t>> DpTpShapeForSlice(const tpu_runtime::SliceSpec& slice,
                                                        int64_t tp);

// InitDeviceMesh(device_type, DpTpShapeForSlice(slice, tp), {"dp", "tp"}).
absl::StatusOr<DeviceMesh> InitDeviceMeshForSlice(absl::string_view device_type,
                                                  const tpu_runtime::SliceSpec& slice,
                                                  int64_t tp, const DeviceMeshEnv& env);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_DEVICE_MESH_H_
