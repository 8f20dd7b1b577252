#include "fsdp/fully_shard/grad_clip.h"

#include <cmath>

#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fsdp/fully_shard/state_dict.h"
#include "fsdp/global_layout.h"
#include "fsdp/mesh_collectives.h"

namespace tpudist::fsdp {

namespace {

// True when `p` is a tensor-parallel piece (its global layout is larger).
bool IsTpPiece(const at::Tensor& p) {
  std::optional<GlobalLayout> g = GetGlobalLayout(p);
  return g.has_value() && g->local_shape != g->full_shape;
}

absl::StatusOr<at::Tensor> SumOver(const DeviceMesh& mesh, int dim, const at::Tensor& t) {
  absl::StatusOr<at::Tensor> sum = AllReduceAlongDim(mesh, dim, t, ReduceOp::kSum);
  if (!sum.ok()) {
    return absl::Status(sum.status().code(), absl::StrCat("ClipGradNorm: ", sum.status().message()));
  }
  return sum;
}

}  // namespace

absl::StatusOr<double> ClipGradNorm(const std::shared_ptr<torch::nn::Module>& model,
                                    const DeviceMesh& mesh, double max_norm) {
  absl::StatusOr<int> tp_dim = TensorParallelDim(mesh);
  if (!tp_dim.ok()) return tp_dim.status();
  const FsdpGroupIndex index = IndexFsdpGroups(model);
  // Squared norms by where each element lives: [0] sharded over dp and tp,
  // [1] sharded over dp only, [2] over tp only, [3] replicated everywhere.
  double sq[4] = {0, 0, 0, 0};
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : model->parameters(true)) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    const bool dp_sharded = index.owner.count(p.unsafeGetTensorImpl()) > 0;
    const bool tp_sharded = *tp_dim > 0 && IsTpPiece(p);
    sq[(dp_sharded ? 0 : 2) + (tp_sharded ? 0 : 1)] += g.to(at::kDouble).pow(2).sum().item<double>();
    grads.push_back(g);
  }
  // Over dp: the dp-sharded pair. Then over tp: the tp-sharded pair.
  // (HSDP: over dp_shard only; replicas hold equal grads.)
  absl::StatusOr<at::Tensor> over_dp = SumOver(mesh, FsdpShardDim(mesh), at::tensor({sq[0], sq[1]}, at::kDouble));  // [2]
  if (!over_dp.ok()) return over_dp.status();
  double total_sq = (*over_dp)[1].item<double>() + sq[3];
  if (*tp_dim > 0) {
    absl::StatusOr<at::Tensor> over_tp =
        SumOver(mesh, *tp_dim, at::tensor({(*over_dp)[0].item<double>(), sq[2]}, at::kDouble));  // [2]
    if (!over_tp.ok()) return over_tp.status();
    total_sq += over_tp->sum().item<double>();
  } else {
    total_sq += (*over_dp)[0].item<double>() + sq[2];
  }
  const double total = std::sqrt(total_sq);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    at::NoGradGuard no_grad;
    for (at::Tensor& g : grads) g.mul_(coef);
  }
  return total;
}

}  // namespace tpudist::fsdp
