#include "models/gemma/gemma_attention.h"

#include <c10/util/Exception.h>

#include "models/gemma/rope.h"

namespace tpudist::models::gemma {
namespace {

nn::Linear MakeLinear(int64_t in, int64_t out) { return nn::Linear(in, out, /*bias=*/false); }

}  // namespace

at::Tensor RepeatKv(const at::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const auto b = x.size(0), kv = x.size(1), s = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv, groups, s, d}).reshape({b, kv * groups, s, d});
}

GemmaAttentionImpl::GemmaAttentionImpl(const GemmaConfig& config, int64_t layer)
    : type_(config.layer_types[layer]),
      num_heads_(config.num_attention_heads),
      num_kv_heads_(config.num_key_value_heads),
      head_dim_(config.HeadDim(layer)),
      is_kv_shared_(config.IsKvShared(layer)),
      stores_kv_(config.StoresSharedKv(layer)) {
  const int64_t h = config.hidden_size;
  q_proj = register_module("q_proj", MakeLinear(h, num_heads_ * head_dim_));
  q_norm = register_module("q_norm", RMSNorm(head_dim_, config.rms_norm_eps));
  if (!is_kv_shared_) {
    k_norm = register_module("k_norm", RMSNorm(head_dim_, config.rms_norm_eps));
    v_norm = register_module("v_norm", RMSNorm(head_dim_, config.rms_norm_eps, /*with_scale=*/false));
    k_proj = register_module("k_proj", MakeLinear(h, num_kv_heads_ * head_dim_));
    v_proj = register_module("v_proj", MakeLinear(h, num_kv_heads_ * head_dim_));
  }
  o_proj = register_module("o_proj", MakeLinear(num_heads_ * head_dim_, h));
}

at::Tensor GemmaAttentionImpl::forward(const at::Tensor& hidden, const at::Tensor& cos,
                                       const at::Tensor& sin, const at::Tensor& mask, SharedKv* shared) {
  return RunForwardHooks({hidden, cos, sin, mask}, [&](const std::vector<at::Tensor>& in) {
           return std::vector<at::Tensor>{Body(in[0], in[1], in[2], in[3], shared)};
         })
      .at(0);
}

at::Tensor GemmaAttentionImpl::Body(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                                    const at::Tensor& mask, SharedKv* shared) {
  const int64_t b = hidden.size(0), s = hidden.size(1);
  at::Tensor q = q_proj->forward(hidden).view({b, s, -1, head_dim_});  // [B, S, H, D]
  q = ApplyRope(q_norm->forward(q), cos, sin).transpose(1, 2);         // [B, H, S, D]

  at::Tensor k, v;  // [B, KV, S, D]
  at::Tensor* slot_k = type_ == LayerType::kSliding ? &shared->sliding_k : &shared->full_k;
  at::Tensor* slot_v = type_ == LayerType::kSliding ? &shared->sliding_v : &shared->full_v;
  if (is_kv_shared_) {
    TORCH_CHECK(shared != nullptr && slot_k->defined(),
                "GemmaAttention: shared layer has no stored K/V for ", LayerTypeName(type_));
    k = *slot_k;
    v = *slot_v;
  } else {
    k = k_proj->forward(hidden).view({b, s, -1, head_dim_});
    k = ApplyRope(k_norm->forward(k), cos, sin).transpose(1, 2);
    v = v_norm->forward(v_proj->forward(hidden).view({b, s, -1, head_dim_})).transpose(1, 2);
    if (stores_kv_ && shared != nullptr) {
      *slot_k = k;
      *slot_v = v;
    }
  }
  // Head counts from the tensors, not the config: under tensor parallelism
  // q_proj / o_proj (and k/v when KV heads divide the ranks) hold this rank's
  // heads only.
  // Eager attention, as the transformers oracle fixtures are made (fp32
  // logits within 1e-5): at::scaled_dot_product_attention's CPU flash kernel
  // (online softmax) was tried and moved the tiny model's logits by up to
  // 1.6e-4, past HfOracle's tolerance.
  const int64_t groups = q.size(1) / k.size(1);
  at::Tensor scores = at::matmul(q, RepeatKv(k, groups).transpose(2, 3));  // [B, H, S, S]; scaling 1.0
  scores = scores + mask;
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  at::Tensor out = at::matmul(probs, RepeatKv(v, groups));  // [B, H, S, D]
  out = out.transpose(1, 2).reshape({b, s, -1});  // [B, S, H * D]
  return o_proj->forward(out);
}

}  // namespace tpudist::models::gemma
