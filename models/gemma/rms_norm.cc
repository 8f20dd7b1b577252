#include "models/gemma/rms_norm.h"

namespace tpudist::models::gemma {

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor mean_sq = xf.pow(2).mean(-1, /*keepdim=*/true) + eps;
  at::Tensor y = xf * at::pow(mean_sq, -0.5);
  if (weight.defined()) y = y * weight.to(at::kFloat);
  return y.to(x.scalar_type());
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, bool with_scale) : eps_(eps) {
  if (with_scale) weight_ = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  return RunForward(x, [this](const at::Tensor& in) { return RmsNorm(in, weight_, eps_); });
}

}  // namespace tpudist::models::gemma
