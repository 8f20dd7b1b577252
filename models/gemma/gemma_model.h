// GemmaForCausalLM: the Gemma 4 text decoder with its tied LM head and
// shifted cross-entropy loss (HF Gemma4ForConditionalGeneration restricted to
// text, use_cache=False semantics; no KV cache: every call runs the whole
// sequence).
//
// Module tree (names are HF's with "model.language_model." replaced by
// "model."; see hf_checkpoint.h for the mapping):
//   model.embed_tokens                 weight [V, hidden]        (padding_idx = pad)
//   model.embed_tokens_per_layer       weight [Vp, L * P]        (padding_idx = pad)
//   model.per_layer_model_projection   weight [L * P, hidden]
//   model.per_layer_projection_norm    weight [P]
//   model.layers.{i}.*                 see gemma_decoder_layer.h
//   model.norm                         weight [hidden]
// lm_head is embed_tokens.weight (tied; no separate parameter).
//
// Forward, in the parameters' dtype (fp32 or bf16):
//   e   = embed_tokens(ids) * sqrt(hidden)           (scale cast to weight dtype)
//   ple = (per_layer_projection_norm(per_layer_model_projection(e) * hidden^-0.5)
//          + embed_tokens_per_layer(ids) * sqrt(P)) * 2^-0.5,  layer i uses [:, :, i]
//   h   = layers(e, ple); h = norm(h)
//   logits = softcap * tanh(h @ E^T / softcap), then upcast to fp32
//   loss = mean CE(logits[:, :-1], labels[:, 1:]) over labels != -100
//
// GemmaTextModel, GemmaForCausalLM, the decoder layers, their attention and
// MLP are HookableModules (nn/module_hooks.h): hooks registered
// from outside (FullyShard, mixed precision) see and may rewrite each
// forward's tensor arguments and outputs. The tied lm_head and the loss run
// inside GemmaForCausalLM's forward body, so the embedding is only used
// inside the root module's forward.
//
// Thread-safety: as torch::nn::Module. The model makes no distributed calls.
#ifndef TPU_DIST_MODELS_GEMMA_GEMMA_MODEL_H_
#define TPU_DIST_MODELS_GEMMA_GEMMA_MODEL_H_

#include <cstdint>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "nn/module_hooks.h"
#include "models/gemma/gemma_config.h"
#include "models/gemma/gemma_decoder_layer.h"
#include "models/gemma/position_tables.h"
#include "models/gemma/rms_norm.h"

namespace tpudist::models::gemma {

inline constexpr int64_t kIgnoreIndex = -100;

class GemmaTextModelImpl : public tpudist::nn::HookableModule {
 public:
  explicit GemmaTextModelImpl(const GemmaConfig& config);

  // input_ids: [B, S] int64; attention_mask: [B, S] (1 real, 0 pad) or
  // undefined. Returns the final-normed hidden states [B, S, hidden].
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask = {});

  // The PLE inputs for `input_ids` given the scaled embeddings.
  // input_ids: [B, S]; inputs_embeds: [B, S, hidden]. Returns [B, S, L, P].
  at::Tensor PerLayerInputs(const at::Tensor& input_ids, const at::Tensor& inputs_embeds);

  const GemmaConfig& config() const { return config_; }

  torch::nn::Embedding embed_tokens{nullptr};            // weight [V, hidden]
  torch::nn::Embedding embed_tokens_per_layer{nullptr};  // weight [Vp, L * P]
  torch::nn::Linear per_layer_model_projection{nullptr}; // weight [L * P, hidden]
  RMSNorm per_layer_projection_norm{nullptr};            // [P]
  torch::nn::ModuleList layers{nullptr};                 // GemmaDecoderLayer x L
  RMSNorm norm{nullptr};                                 // [hidden]

 private:
  // input_ids: [B, S]; attention_mask: [B, S] or undefined.
  at::Tensor Body(const at::Tensor& input_ids, const at::Tensor& attention_mask);

  GemmaConfig config_;
  // RoPE cos/sin and unpadded masks for the last (S, dtype, device) seen;
  // handed read-only to the layers (see position_tables.h).
  PositionTables tables_;
};
TORCH_MODULE(GemmaTextModel);

struct CausalLMOutput {
  at::Tensor logits;  // [B, S, V] fp32, after softcapping
  at::Tensor loss;    // [] fp32; undefined when no labels were given
};

class GemmaForCausalLMImpl : public tpudist::nn::HookableModule {
 public:
  explicit GemmaForCausalLMImpl(const GemmaConfig& config);

  // input_ids: [B, S] int64; attention_mask: [B, S] or undefined;
  // labels: [B, S] int64 (kIgnoreIndex = ignored) or undefined.
  CausalLMOutput forward(const at::Tensor& input_ids, const at::Tensor& attention_mask = {},
                         const at::Tensor& labels = {});

  const GemmaConfig& config() const { return model->config(); }

  GemmaTextModel model{nullptr};

 private:
  // Same arguments as forward, after the hooks.
  CausalLMOutput Body(const at::Tensor& input_ids, const at::Tensor& attention_mask, const at::Tensor& labels);
};
TORCH_MODULE(GemmaForCausalLM);

// Shifted causal-LM loss. logits: [B, S, V] (any float dtype, upcast to
// fp32); labels: [B, S]. Mean over positions whose shifted label != -100.
at::Tensor CausalLMLoss(const at::Tensor& logits, const at::Tensor& labels);

struct InitOptions {
  uint64_t seed = 0;
  double std = 0.02;          // normal init of Linear and Embedding weights
  double layer_scalar = 1.0;  // value of every layer_scalar buffer
};

// HF-like init: Linear/Embedding ~ N(0, std) (embedding padding row zeroed),
// norms ones, layer_scalar = options.layer_scalar. Deterministic in the seed
// (uses a private CPU generator; global RNG state is untouched).
void InitGemmaWeights(GemmaForCausalLMImpl& model, const InitOptions& options);

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_GEMMA_MODEL_H_
