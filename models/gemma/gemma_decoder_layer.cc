#include "models/gemma/gemma_decoder_layer.h"

namespace tpudist::models::gemma {
namespace {

torch::nn::Linear MakeLinear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

nn::Linear MakeHookableLinear(int64_t in, int64_t out) { return nn::Linear(in, out, /*bias=*/false); }

at::Tensor GeluTanh(const at::Tensor& x) { return at::gelu(x, "tanh"); }

}  // namespace

GemmaMlpImpl::GemmaMlpImpl(int64_t hidden, int64_t intermediate) {
  gate_proj = register_module("gate_proj", MakeHookableLinear(hidden, intermediate));
  up_proj = register_module("up_proj", MakeHookableLinear(hidden, intermediate));
  down_proj = register_module("down_proj", MakeHookableLinear(intermediate, hidden));
}

at::Tensor GemmaMlpImpl::forward(const at::Tensor& x) {
  return RunForward(x, [this](const at::Tensor& in) {
    return down_proj->forward(GeluTanh(gate_proj->forward(in)) * up_proj->forward(in));
  });
}

GemmaDecoderLayerImpl::GemmaDecoderLayerImpl(const GemmaConfig& config, int64_t layer) {
  const int64_t h = config.hidden_size;
  const double eps = config.rms_norm_eps;
  self_attn = register_module("self_attn", GemmaAttention(config, layer));
  mlp = register_module("mlp", GemmaMlp(h, config.IntermediateSize(layer)));
  input_layernorm = register_module("input_layernorm", RMSNorm(h, eps));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(h, eps));
  pre_feedforward_layernorm = register_module("pre_feedforward_layernorm", RMSNorm(h, eps));
  post_feedforward_layernorm = register_module("post_feedforward_layernorm", RMSNorm(h, eps));
  layer_scalar = register_buffer("layer_scalar", at::ones({1}));
  const int64_t p = config.hidden_size_per_layer_input;
  if (p > 0) {
    per_layer_input_gate = register_module("per_layer_input_gate", MakeLinear(h, p));
    per_layer_projection = register_module("per_layer_projection", MakeLinear(p, h));
    post_per_layer_input_norm = register_module("post_per_layer_input_norm", RMSNorm(h, eps));
  }
}

at::Tensor GemmaDecoderLayerImpl::forward(const at::Tensor& hidden, const at::Tensor& per_layer_input,
                                          const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask,
                                          SharedKv* shared) {
  return RunForwardHooks({hidden, per_layer_input, cos, sin, mask}, [&](const std::vector<at::Tensor>& in) {
           return std::vector<at::Tensor>{Body(in[0], in[1], in[2], in[3], in[4], shared)};
         })
      .at(0);
}

at::Tensor GemmaDecoderLayerImpl::Body(const at::Tensor& hidden, const at::Tensor& per_layer_input,
                                       const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask,
                                       SharedKv* shared) {
  at::Tensor h = hidden;
  at::Tensor a = self_attn->forward(input_layernorm->forward(h), cos, sin, mask, shared);
  h = h + post_attention_layernorm->forward(a);
  h = h + post_feedforward_layernorm->forward(mlp->forward(pre_feedforward_layernorm->forward(h)));
  if (!per_layer_input_gate.is_empty()) {
    at::Tensor g = GeluTanh(per_layer_input_gate->forward(h)) * per_layer_input;
    h = h + post_per_layer_input_norm->forward(per_layer_projection->forward(g));
  }
  return h * layer_scalar;
}

}  // namespace tpudist::models::gemma
