// Hookable leaf layers: Linear, Embedding and LayerNorm as HookableModules,
// so hook owners (tensor-parallel styles, FullyShard) can wrap the layers a
// model holds without the model knowing.
//
// Each is numerically identical to its torch::nn counterpart (the forward
// body is the same ATen call: at::linear / at::embedding / at::layer_norm)
// and registers the same direct parameters ("weight", "bias"), so FQNs stay
// "q_proj.weight" and checkpoints written from torch::nn modules load
// unchanged. Initialisation follows torch::nn (kaiming-uniform Linear,
// normal Embedding, ones/zeros LayerNorm).
//
// Parameters are read from the registered tensors on every forward (a hook
// may set_data them between calls). Linear's bias may be handed to a hook
// owner (set_bias_in_body(false)): the body then skips it and the owner adds
// it, e.g. after a row-parallel reduction.
//
// Thread-safety: like any torch::nn::Module.
#ifndef TPU_DIST_NN_LAYERS_H_
#define TPU_DIST_NN_LAYERS_H_

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/pimpl.h>

#include "nn/module_hooks.h"

namespace tpudist::nn {

class LinearImpl : public HookableModule {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias = true);
  // x: [..., in] -> [..., out]
  at::Tensor forward(const at::Tensor& x);

  // false: the body computes x W^T only; whoever set it adds `bias`.
  void set_bias_in_body(bool in_body) { bias_in_body_ = in_body; }
  bool bias_in_body() const { return bias_in_body_; }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

  at::Tensor weight;  // [out, in] (or this rank's piece once partitioned)
  at::Tensor bias;    // [out]; undefined without bias

 private:
  int64_t in_features_, out_features_;
  bool bias_in_body_ = true;
};
TORCH_MODULE(Linear);

class EmbeddingImpl : public HookableModule {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim);
  // ids: [...] int64 -> [..., dim]
  at::Tensor forward(const at::Tensor& ids);

  at::Tensor weight;  // [num, dim] (or this rank's piece once partitioned)
};
TORCH_MODULE(Embedding);

class LayerNormImpl : public HookableModule {
 public:
  explicit LayerNormImpl(int64_t dim, double eps = 1e-5);
  // x: [..., dim] -> [..., dim]
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;  // [dim]
  at::Tensor bias;    // [dim]

 private:
  int64_t dim_;
  double eps_;
};
TORCH_MODULE(LayerNorm);

}  // namespace tpudist::nn

#endif  // TPU_DIST_NN_LAYERS_H_
