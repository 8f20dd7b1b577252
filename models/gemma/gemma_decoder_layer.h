// Gemma 4 decoder layer (HF Gemma4TextDecoderLayer) and its MLP.
//
//   r=h; h=post_attention_layernorm(self_attn(input_layernorm(h))); h=r+h
//   r=h; h=post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))); h=r+h
//   r=h; g=gelu_tanh(per_layer_input_gate(h)) * per_layer_input
//        h=r+post_per_layer_input_norm(per_layer_projection(g))
//   h = h * layer_scalar           (the whole residual stream)
// mlp(x) = down_proj(gelu_tanh(gate_proj(x)) * up_proj(x)); KV-shared layers
// are twice as wide when use_double_wide_mlp.
//
// Submodule/parameter names match HF. `layer_scalar` is a persistent buffer
// [1] loaded from checkpoints. Both modules are HookableModules (FullyShard
// wraps `mlp` and whole layers from outside).
#ifndef TPU_DIST_MODELS_GEMMA_GEMMA_DECODER_LAYER_H_
#define TPU_DIST_MODELS_GEMMA_GEMMA_DECODER_LAYER_H_

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "nn/layers.h"
#include "nn/module_hooks.h"
#include "models/gemma/gemma_attention.h"
#include "models/gemma/gemma_config.h"
#include "models/gemma/rms_norm.h"

namespace tpudist::models::gemma {

class GemmaMlpImpl : public tpudist::nn::HookableModule {
 public:
  GemmaMlpImpl(int64_t hidden, int64_t intermediate);
  // x: [..., hidden] -> [..., hidden]
  at::Tensor forward(const at::Tensor& x);

  nn::Linear gate_proj{nullptr};  // weight [I, hidden] (I/tp rows under TP)
  nn::Linear up_proj{nullptr};    // weight [I, hidden] (I/tp rows under TP)
  nn::Linear down_proj{nullptr};  // weight [hidden, I] (I/tp columns under TP)
};
TORCH_MODULE(GemmaMlp);

class GemmaDecoderLayerImpl : public tpudist::nn::HookableModule {
 public:
  GemmaDecoderLayerImpl(const GemmaConfig& config, int64_t layer);

  // hidden: [B, S, hidden]; per_layer_input: [B, S, P] (undefined when the
  // config has no per-layer inputs); cos, sin: [B or 1, S, D]; mask: additive
  // [B or 1, 1, S, S]. Returns [B, S, hidden].
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& per_layer_input, const at::Tensor& cos,
                     const at::Tensor& sin, const at::Tensor& mask, SharedKv* shared);

  GemmaAttention self_attn{nullptr};
  GemmaMlp mlp{nullptr};
  RMSNorm input_layernorm{nullptr};             // [hidden]
  RMSNorm post_attention_layernorm{nullptr};    // [hidden]
  RMSNorm pre_feedforward_layernorm{nullptr};   // [hidden]
  RMSNorm post_feedforward_layernorm{nullptr};  // [hidden]
  torch::nn::Linear per_layer_input_gate{nullptr};  // weight [P, hidden]
  torch::nn::Linear per_layer_projection{nullptr};  // weight [hidden, P]
  RMSNorm post_per_layer_input_norm{nullptr};       // [hidden]
  at::Tensor layer_scalar;                          // [1] buffer

 private:
  // Same arguments as forward, after the hooks.
  at::Tensor Body(const at::Tensor& hidden, const at::Tensor& per_layer_input, const at::Tensor& cos,
                  const at::Tensor& sin, const at::Tensor& mask, SharedKv* shared);
};
TORCH_MODULE(GemmaDecoderLayer);

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_GEMMA_DECODER_LAYER_H_
