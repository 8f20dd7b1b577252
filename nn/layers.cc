#include "nn/layers.h"

#include <cmath>

#include <torch/nn/init.h>

namespace tpudist::nn {

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool bias)
    : HookableModule("Linear"), in_features_(in_features), out_features_(out_features) {
  // torch::nn::LinearImpl::reset / reset_parameters.
  weight = register_parameter("weight", at::empty({out_features, in_features}));
  if (bias) this->bias = register_parameter("bias", at::empty({out_features}));
  at::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  if (bias) {
    const auto fan_in = std::get<0>(torch::nn::init::_calculate_fan_in_and_fan_out(weight));
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    torch::nn::init::uniform_(this->bias, -bound, bound);
  }
}

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  return RunForward(x, [&](const at::Tensor& in) {
    return at::linear(in, weight, bias_in_body_ ? bias : at::Tensor());
  });
}

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim)
    : HookableModule("Embedding") {
  weight = register_parameter("weight", at::empty({num_embeddings, embedding_dim}));
  at::NoGradGuard no_grad;
  torch::nn::init::normal_(weight);
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) {
  return RunForward(ids, [&](const at::Tensor& in) { return at::embedding(weight, in); });
}

LayerNormImpl::LayerNormImpl(int64_t dim, double eps)
    : HookableModule("LayerNorm"), dim_(dim), eps_(eps) {
  weight = register_parameter("weight", at::ones({dim}));
  bias = register_parameter("bias", at::zeros({dim}));
}

at::Tensor LayerNormImpl::forward(const at::Tensor& x) {
  return RunForward(x, [&](const at::Tensor& in) {
    return at::layer_norm(in, {dim_}, weight, bias, eps_);
  });
}

}  // namespace tpudist::nn
