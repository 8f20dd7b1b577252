#include "fsdp/dtensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fsdp/mesh_collectives.h"
#include "fsdp/mesh_math.h"
#include "fsdp/redistribute.h"
#include "fsdp/shard_math.h"

namespace tpudist::fsdp {

std::string DTensor::ToString() const {
  return absl::StrCat("DTensor(global (", absl::StrJoin(global_shape_, ", "), "), ",
                      PlacementsToString(placements_), ", local (",
                      absl::StrJoin(local_.sizes(), ", "), "))");
}

absl::StatusOr<DTensor> FromLocal(const at::Tensor& local, const DeviceMesh& mesh,
                                  absl::Span<const Placement> placements,
                                  std::optional<std::vector<int64_t>> global_shape) {
  absl::StatusOr<Placements> p = NormalizePlacements(placements, local.dim(), mesh.ndim());
  if (!p.ok()) return p.status();
  std::vector<int64_t> shape;
  if (global_shape.has_value()) {
    shape = *global_shape;
  } else {
    shape = local.sizes().vec();
    for (int m = 0; m < mesh.ndim(); ++m) {
      if ((*p)[m].is_shard()) shape[(*p)[m].dim()] *= mesh.size(m);
    }
  }
  const std::vector<int64_t> expected = LocalShape(shape, mesh.shape(), mesh.coordinate(), *p);
  if (local.sizes().vec() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", mesh.global_rank(), ": FromLocal got a local of shape (",
        absl::StrJoin(local.sizes(), ", "), ") but global (", absl::StrJoin(shape, ", "),
        ") placed ", PlacementsToString(*p), " needs (", absl::StrJoin(expected, ", "), ")"));
  }
  return DTensor(local, mesh, *std::move(p), std::move(shape));
}

absl::StatusOr<DTensor> DistributeTensor(const at::Tensor& full, const DeviceMesh& mesh,
                                         absl::Span<const Placement> placements,
                                         std::optional<int> src_data_rank) {
  absl::StatusOr<Placements> p = NormalizePlacements(placements, full.dim(), mesh.ndim());
  if (!p.ok()) return p.status();
  for (const Placement& q : *p) {
    if (q.is_partial()) {
      return absl::InvalidArgumentError(
          "DistributeTensor does not accept Partial placements; use FromLocal");
    }
  }
  at::Tensor data = full.detach();
  if (src_data_rank.has_value()) {
    absl::StatusOr<std::vector<int64_t>> root =
        CoordinateOfRank(mesh.shape(), mesh.ranks(), *src_data_rank);
    if (!root.ok()) return root.status();
    for (int d = 0; d < mesh.ndim(); ++d) {
      absl::StatusOr<at::Tensor> b = BroadcastAlongDim(mesh, d, data, (*root)[d]);
      if (!b.ok()) return b.status();
      data = *b;
    }
  }
  std::vector<Placement> replicated(mesh.ndim(), Placement::Replicate());
  absl::StatusOr<at::Tensor> local =
      RedistributeLocal(data, mesh, full.sizes().vec(), replicated, *p);
  if (!local.ok()) return local.status();
  at::Tensor leaf = local->detach().clone();
  leaf.set_requires_grad(full.requires_grad());
  return FromLocal(leaf, mesh, *p, full.sizes().vec());
}

absl::StatusOr<DTensor> Redistribute(const DTensor& x, absl::Span<const Placement> placements,
                                     absl::Span<const Placement> grad_placements) {
  absl::StatusOr<Placements> dst =
      NormalizePlacements(placements, x.local().dim(), x.mesh().ndim());
  if (!dst.ok()) return dst.status();
  Placements grad;
  if (!grad_placements.empty()) {
    absl::StatusOr<Placements> g =
        NormalizePlacements(grad_placements, x.local().dim(), x.mesh().ndim());
    if (!g.ok()) return g.status();
    grad = *g;
  }
  absl::StatusOr<at::Tensor> local = RedistributeLocalAutograd(
      x.local(), x.mesh(), x.global_shape(), x.placements(), *dst, grad);
  if (!local.ok()) return local.status();
  return FromLocal(*local, x.mesh(), *dst, x.global_shape());
}

absl::StatusOr<at::Tensor> ToLocal(const DTensor& x, absl::Span<const Placement> grad_placements) {
  if (grad_placements.empty()) return x.local();
  absl::StatusOr<DTensor> same = Redistribute(x, x.placements(), grad_placements);
  if (!same.ok()) return same.status();
  return same->local();
}

absl::StatusOr<at::Tensor> FullTensor(const DTensor& x) {
  std::vector<Placement> replicated(x.mesh().ndim(), Placement::Replicate());
  absl::StatusOr<DTensor> full = Redistribute(x, replicated);
  if (!full.ok()) return full.status();
  return full->local();
}

}  // namespace tpudist::fsdp
