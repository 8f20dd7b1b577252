// DTensor: a logical (global) tensor distributed over a DeviceMesh, stored as
// this rank's local tensor plus one Placement per mesh dim (PyTorch 2.x
// semantics; see fsdp/placement.h and docs/dtensor.md).
//
//   auto x = DistributeTensor(full, mesh, {Placement::Shard(0)});  // StatusOr
//   auto y = Redistribute(*x, {Placement::Replicate()});           // all_gather
//   at::Tensor local = ToLocal(*y).value();
//
// The local tensor is an ordinary at::Tensor on the autograd tape: local ops
// (matmul, add...) are plain ATen ops on ToLocal(), and layout changes go
// through Redistribute, which is differentiable. Gradient layouts follow the
// rule in fsdp/redistribute.h (DefaultGradPlacements unless declared).
//
// A DTensor is a cheap copyable value (tensor and mesh are shared). Functions
// that communicate are collective over the mesh: every rank calls them in
// the same order with the same placements.
#ifndef TPU_DIST_FSDP_DTENSOR_H_
#define TPU_DIST_FSDP_DTENSOR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "fsdp/device_mesh.h"
#include "fsdp/placement.h"

namespace tpudist::fsdp {

class DTensor {
 public:
  // This rank's piece: [LocalShape(global_shape, placements)].
  const at::Tensor& local() const { return local_; }
  const DeviceMesh& mesh() const { return mesh_; }
  // Normalized (no negative Shard dims), one per mesh dim.
  const Placements& placements() const { return placements_; }
  const std::vector<int64_t>& global_shape() const { return global_shape_; }

  // "DTensor(global (8, 4), [S(0), R], local (4, 4))".
  std::string ToString() const;

 private:
  friend absl::StatusOr<DTensor> FromLocal(const at::Tensor&, const DeviceMesh&,
                                           absl::Span<const Placement>,
                                           std::optional<std::vector<int64_t>>);
  DTensor(at::Tensor local, DeviceMesh mesh, Placements placements, std::vector<int64_t> shape)
      : local_(std::move(local)), mesh_(std::move(mesh)), placements_(std::move(placements)),
        global_shape_(std::move(shape)) {}

  at::Tensor local_;  // [LocalShape(global_shape_, placements_)]
  DeviceMesh mesh_;
  Placements placements_;
  std::vector<int64_t> global_shape_;
};

// Wraps this rank's `local` piece. `global_shape` defaults to PyTorch's
// run_check=False inference: local size times the mesh-dim size along every
// sharded dim (exact only for even shards; pass the shape when uneven).
// InvalidArgument when placements are malformed or local's shape does not
// match the given global shape. No communication; local keeps its autograd
// history (FromLocal is the identity on the tape).
// local: [local shape]
absl::StatusOr<DTensor> FromLocal(const at::Tensor& local, const DeviceMesh& mesh,
                                  absl::Span<const Placement> placements,
                                  std::optional<std::vector<int64_t>> global_shape = std::nullopt);

// Splits `full` (the whole tensor, [global shape]) by `placements`. With
// src_data_rank set, every rank first receives that global rank's `full`
// (broadcast along each mesh dim, as PyTorch's src_data_rank=0); nullopt
// skips communication and trusts every rank to pass the same tensor. Partial
// placements are rejected (PyTorch allows them only from ops / from_local).
// The result is a new leaf: local requires grad iff `full` does.
absl::StatusOr<DTensor> DistributeTensor(const at::Tensor& full, const DeviceMesh& mesh,
                                         absl::Span<const Placement> placements,
                                         std::optional<int> src_data_rank = 0);

// The same logical tensor placed as `placements` (differentiable).
// `grad_placements` declares the layout of the gradient that will flow back
// into the result (empty: DefaultGradPlacements(placements)).
absl::StatusOr<DTensor> Redistribute(const DTensor& x, absl::Span<const Placement> placements,
                                     absl::Span<const Placement> grad_placements = {});

// The local piece. With `grad_placements` (PyTorch's to_local(grad_placements))
// the gradient flowing back into the returned tensor is read in that layout
// and converted to x's gradient layout, e.g. a Replicate x whose local feeds
// a sharded matmul declares Partial and gets an all_reduce in backward.
absl::StatusOr<at::Tensor> ToLocal(const DTensor& x,
                                   absl::Span<const Placement> grad_placements = {});

// The whole logical tensor on every rank (Redistribute to all-Replicate).
// Returns: [global shape]
absl::StatusOr<at::Tensor> FullTensor(const DTensor& x);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_DTENSOR_H_
