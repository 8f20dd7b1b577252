// The collectives DTensor issues along one mesh dimension, on that dim's
// process group, with torch.chunk padding handled here. Each returns a new
// tensor (inputs are never modified), waits with the mesh's collective
// timeout, and turns a c10d exception into an absl::Status naming the op,
// this rank, the mesh dim, the group size and the bytes.
//
// Only standard c10d::ProcessGroup ops are used (allgather, allreduce,
// reduce_scatter, alltoall_base, broadcast); a backend lacking one (Gloo 1.13
// has no reduce_scatter) fails with that backend's error, there is no
// fallback here.
//
// Thread-safety: as the process group: members call the same sequence.
#ifndef TPU_DIST_FSDP_MESH_COLLECTIVES_H_
#define TPU_DIST_FSDP_MESH_COLLECTIVES_H_

#include <cstdint>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "fsdp/device_mesh.h"
#include "fsdp/placement.h"

namespace tpudist::fsdp {

// `local` is piece LocalRank(mesh_dim) of torch.chunk(T, size(mesh_dim),
// tensor_dim) where T has `logical_size` elements along tensor_dim; returns T.
// local: [..., chunk, ...] -> [..., logical_size, ...]
absl::StatusOr<at::Tensor> AllGatherAlongDim(const DeviceMesh& mesh, int mesh_dim,
                                             const at::Tensor& local, int64_t tensor_dim,
                                             int64_t logical_size);

// Reduction of `local` over the group; same shape. kAvg = sum / group size.
absl::StatusOr<at::Tensor> AllReduceAlongDim(const DeviceMesh& mesh, int mesh_dim,
                                             const at::Tensor& local, ReduceOp op);

// This rank's torch.chunk piece along tensor_dim of the reduction of `local`.
// local: [..., L, ...] -> [..., chunk(L), ...]
absl::StatusOr<at::Tensor> ReduceScatterAlongDim(const DeviceMesh& mesh, int mesh_dim,
                                                 const at::Tensor& local, int64_t tensor_dim,
                                                 ReduceOp op);

// `local` is this rank's chunk along `from_dim` (of a tensor with
// `from_logical_size` there) and full along `to_dim`; returns the full
// `from_dim` and this rank's chunk of `to_dim`.
absl::StatusOr<at::Tensor> AllToAllAlongDim(const DeviceMesh& mesh, int mesh_dim,
                                            const at::Tensor& local, int64_t from_dim,
                                            int64_t from_logical_size, int64_t to_dim);

// The tensor of the group member at coordinate `root` along mesh_dim.
// REQUIRES: `local` has the same shape and dtype on every member.
absl::StatusOr<at::Tensor> BroadcastAlongDim(const DeviceMesh& mesh, int mesh_dim,
                                             const at::Tensor& local, int64_t root);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_MESH_COLLECTIVES_H_
