// Gemma 4 self-attention (HF Gemma4TextAttention, >= 5.5.2 KV sharing).
//
//   q = q_norm(q_proj(x).view(B,S,H,D)) -> RoPE
//   non-shared layer: k = RoPE(k_norm(k_proj(x))), v = v_norm(v_proj(x))
//                     (v_norm has no scale); the last non-shared layer of each
//                     type stores its K/V into SharedKv.
//   shared layer:     no k/v projections or norms; K/V are the stored ones of
//                     the last non-shared layer of the same type, always
//                     (training included).
//   out = o_proj(softmax(q k^T * 1.0 + mask) v), MQA via repeat_kv.
//
// Submodule names match HF: q_proj, k_proj, v_proj, o_proj, q_norm, k_norm,
// v_norm. Parameters are read only through the registered tensors on every
// forward (no cached derived tensors), so a sharding wrapper may set_data them
// between calls.
//
// A HookableModule: forward runs its tensor arguments through registered
// hooks (FullyShard, mixed precision) before the body. The projections are
// hookable nn::Linear layers, so a tensor-parallel plan may shard them
// (models/gemma/parallelize_gemma.h): the body takes head counts from the
// tensors it gets (H/tp local query heads, KV or KV/tp key/value heads), so
// it runs unchanged on this rank's heads.
//
// Thread-safety: like any torch::nn::Module; not safe for concurrent forward
// calls that share one SharedKv.
#ifndef TPU_DIST_MODELS_GEMMA_GEMMA_ATTENTION_H_
#define TPU_DIST_MODELS_GEMMA_GEMMA_ATTENTION_H_

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "nn/layers.h"
#include "nn/module_hooks.h"
#include "models/gemma/gemma_config.h"
#include "models/gemma/rms_norm.h"

namespace tpudist::models::gemma {

// K/V handed from the last non-shared layer of each type to the shared ones.
// Owned by the model forward; one per forward call.
struct SharedKv {
  at::Tensor sliding_k;  // [B, kv_heads, S, head_dim]
  at::Tensor sliding_v;  // [B, kv_heads, S, head_dim]
  at::Tensor full_k;     // [B, kv_heads, S, global_head_dim]
  at::Tensor full_v;     // [B, kv_heads, S, global_head_dim]
};

// key/value: [B, KV, S, D] -> [B, KV * groups, S, D].
at::Tensor RepeatKv(const at::Tensor& x, int64_t groups);

class GemmaAttentionImpl : public tpudist::nn::HookableModule {
 public:
  GemmaAttentionImpl(const GemmaConfig& config, int64_t layer);

  // hidden: [B, S, hidden]; cos, sin: [B or 1, S, D] in hidden's dtype;
  // mask: additive [B or 1, 1, S, S] in hidden's dtype.
  // `shared`: read by shared layers, written by storing layers. REQUIRES: a
  // shared layer's source layer ran earlier in the same forward with `shared`.
  // Returns [B, S, hidden].
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& mask, SharedKv* shared);

  bool is_kv_shared() const { return is_kv_shared_; }
  int64_t head_dim() const { return head_dim_; }

  nn::Linear q_proj{nullptr};  // weight [H*D, hidden]
  nn::Linear k_proj{nullptr};  // weight [KV*D, hidden]; null on shared layers
  nn::Linear v_proj{nullptr};  // weight [KV*D, hidden]; null on shared layers
  nn::Linear o_proj{nullptr};  // weight [hidden, H*D]
  RMSNorm q_norm{nullptr};            // weight [D]
  RMSNorm k_norm{nullptr};            // weight [D]; null on shared layers
  RMSNorm v_norm{nullptr};            // no weight; null on shared layers

 private:
  // The forward body on the (possibly hook-rewritten) tensors.
  // hidden: [B, S, hidden]; cos, sin: [B or 1, S, D]; mask: [B or 1, 1, S, S].
  at::Tensor Body(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask,
                  SharedKv* shared);

  LayerType type_;
  int64_t num_heads_;
  int64_t num_kv_heads_;
  int64_t head_dim_;
  bool is_kv_shared_;
  bool stores_kv_;
};
TORCH_MODULE(GemmaAttention);

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_GEMMA_ATTENTION_H_
