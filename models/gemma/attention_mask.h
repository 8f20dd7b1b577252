// Attention masks for Gemma 4 (HF masking_utils semantics).
//
// Full-attention layers: causal, key k visible to query q iff k <= q.
// Sliding layers: causal AND k > q - window, i.e. each query sees itself and
// the previous window - 1 tokens. An optional padding mask [B, S] (1 = real
// token, 0 = padding) additionally hides padded keys. The additive form puts 0
// on visible and the dtype's lowest value on hidden positions (a fully hidden
// row therefore stays finite and softmaxes to a uniform row, as in HF).
//
// Pure functions.
#ifndef TPU_DIST_MODELS_GEMMA_ATTENTION_MASK_H_
#define TPU_DIST_MODELS_GEMMA_ATTENTION_MASK_H_

#include <optional>

#include <ATen/ATen.h>

namespace tpudist::models::gemma {

// Returns bool [B or 1, 1, S, S]: true where query row may attend key column.
// `window`: nullopt for full attention. `padding_mask`: [B, S] (any integer or
// bool dtype) or undefined.
at::Tensor VisibleMask(int64_t seq_len, std::optional<int64_t> window, const at::Tensor& padding_mask);

// visible: bool [..., S, S] -> additive [..., S, S] in `dtype`.
at::Tensor AdditiveMask(const at::Tensor& visible, at::ScalarType dtype);

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_ATTENTION_MASK_H_
