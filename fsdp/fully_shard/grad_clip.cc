#include "fsdp/fully_shard/grad_clip.h"

#include <cmath>
#include <exception>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/strings/str_cat.h"
#include "collectives/exception_message.h"
#include "fsdp/fully_shard/state_dict.h"

namespace tpudist::fsdp {

absl::StatusOr<double> ClipGradNorm(const std::shared_ptr<torch::nn::Module>& model,
                                    const DeviceMesh& mesh, double max_norm) {
  const FsdpGroupIndex index = IndexFsdpGroups(model);
  double sharded_sq = 0, replicated_sq = 0;
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : model->parameters(true)) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    const double sq = g.to(at::kDouble).pow(2).sum().item<double>();
    (index.owner.count(p.unsafeGetTensorImpl()) ? sharded_sq : replicated_sq) += sq;
    grads.push_back(g);
  }
  std::vector<at::Tensor> t = {at::full({1}, sharded_sq, at::kDouble)};
  try {
    if (!mesh.Group(0)->allreduce(t)->wait(mesh.collective_timeout_ms())) {
      return absl::DeadlineExceededError("ClipGradNorm: all-reduce of the squared norm timed out");
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("ClipGradNorm: all-reduce failed: ", ::tpudist::collectives::ExceptionMessage(e)));
  }
  const double total = std::sqrt(t[0].item<double>() + replicated_sq);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    at::NoGradGuard no_grad;
    for (at::Tensor& g : grads) g.mul_(coef);
  }
  return total;
}

}  // namespace tpudist::fsdp
