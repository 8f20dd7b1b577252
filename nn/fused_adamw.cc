#include "nn/fused_adamw.h"

#include <map>
#include <memory>
#include <tuple>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace tpudist::nn {
namespace {

// The tensors of one fused call: parameters of one dtype and device.
struct Bucket {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
};

}  // namespace

at::Tensor FusedAdamW::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  for (torch::optim::OptimizerParamGroup& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::map<std::pair<int, std::string>, Bucket> buckets;  // by (dtype, device)
    std::vector<at::Tensor> stale;      // step counters to refresh: [] fp32
    std::vector<at::Scalar> stale_to;   // their new values
    for (at::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "FusedAdamW: sparse gradients are not supported");
      TORCH_CHECK(p.is_contiguous(), "FusedAdamW: parameter of shape ", p.sizes(),
                  " is not contiguous");
      void* key = p.unsafeGetTensorImpl();
      auto& slot = state_[key];
      if (slot == nullptr) {
        auto s = std::make_unique<torch::optim::AdamWParamState>();
        s->exp_avg(at::zeros_like(p, at::MemoryFormat::Contiguous));
        s->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Contiguous));
        if (o.amsgrad()) s->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Contiguous));
        slot = std::move(s);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*slot);
      StepCounter& counter = steps_[key];
      if (!counter.value.defined()) counter.value = at::zeros({}, at::kFloat);
      if (counter.mirrors != state.step()) {  // new, loaded or changed from outside
        stale.push_back(counter.value);
        stale_to.emplace_back(static_cast<double>(state.step()));
      }
      state.step(state.step() + 1);
      counter.mirrors = state.step();
      Bucket& b = buckets[{static_cast<int>(p.scalar_type()), p.device().str()}];
      b.params.push_back(p);
      b.grads.push_back(p.grad().contiguous());
      b.exp_avgs.push_back(state.exp_avg());
      b.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (o.amsgrad()) b.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      b.steps.push_back(counter.value);
    }
    for (size_t i = 0; i < stale.size(); ++i) stale[i].fill_(stale_to[i]);
    for (auto& [key, b] : buckets) {
      at::_foreach_add_(b.steps, 1);
      at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs, b.steps,
                        o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(),
                        o.eps(), o.amsgrad(), /*maximize=*/false);
    }
  }
  return loss;
}

}  // namespace tpudist::nn
