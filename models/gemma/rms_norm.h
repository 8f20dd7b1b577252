// Gemma 4 RMSNorm: y = x * (mean(x^2) + eps)^-0.5 [* weight], computed in fp32
// and cast back to x's dtype. The scale is the plain weight (initialised to
// ones), not Gemma 3's (1 + weight). with_scale=false (no parameter) is the
// V norm.
//
// Thread-safety: forward is const on the parameters; the usual torch::nn
// rules apply (no concurrent forward with set_data on `weight`).
#ifndef TPU_DIST_MODELS_GEMMA_RMS_NORM_H_
#define TPU_DIST_MODELS_GEMMA_RMS_NORM_H_

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "nn/module_hooks.h"

namespace tpudist::models::gemma {

// Pure function. `x`: [..., dim]; `weight`: [dim] or undefined (no scale).
// Returns [..., dim] in x's dtype, bit-identical to the composite formula
// above. fp32: records one autograd node, forward and backward as hand
// loops over the rows (first-order gradients only: a double backward would
// treat the saved x and scale as constants); other dtypes: the composite
// formula's ops. Uses at::parallel_for's threads; the weight gradient does
// not depend on their number.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// A HookableModule (hooks empty unless a plan registers some, e.g. the
// tensor-parallel gradient reduction of a per-head norm).
class RMSNormImpl : public tpudist::nn::HookableModule {
 public:
  RMSNormImpl(int64_t dim, double eps, bool with_scale = true);

  // x: [..., dim] -> [..., dim]
  at::Tensor forward(const at::Tensor& x);

  bool with_scale() const { return weight_.defined(); }
  const at::Tensor& weight() const { return weight_; }

 private:
  double eps_;
  at::Tensor weight_;  // [dim], registered as "weight"; undefined when !with_scale
};
TORCH_MODULE(RMSNorm);

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_RMS_NORM_H_
