// Rotary position embeddings as Gemma 4 uses them (HF rotate_half layout).
//
// Two variants, one per layer type:
//  - "default": inv_freq[j] = 1 / theta^(2j / D), j < D/2.
//  - "proportional" (full-attention layers): only the first
//    floor(partial_rotary_factor * D / 2) frequencies are non-zero, with the
//    exponent denominator still the full D; the remaining frequencies are 0,
//    so those dimension pairs (j, j + D/2) pass through unchanged; all of
//    them are then divided by `factor` (default 1).
// cos/sin are computed in fp32 from emb = cat(freqs, freqs) and cast to the
// activation dtype; x_rot = x * cos + rotate_half(x) * sin.
//
// All functions are pure.
#ifndef TPU_DIST_MODELS_GEMMA_ROPE_H_
#define TPU_DIST_MODELS_GEMMA_ROPE_H_

#include <utility>

#include <ATen/ATen.h>

#include "models/gemma/gemma_config.h"

namespace tpudist::models::gemma {

// Returns [head_dim / 2] fp32 inverse frequencies.
// REQUIRES: head_dim even; params.rope_type is "default" or "proportional".
at::Tensor RopeInvFreq(const RopeParameters& params, int64_t head_dim);

// inv_freq: [D/2] fp32; positions: [B, S] int64. Returns {cos, sin}, each
// [B, S, D] in `dtype`.
std::pair<at::Tensor, at::Tensor> RopeCosSin(const at::Tensor& inv_freq, const at::Tensor& positions,
                                             at::ScalarType dtype);

// x: [..., D] -> [..., D], (x1, x2) -> (-x2, x1) over the two halves.
at::Tensor RotateHalf(const at::Tensor& x);

// x: [B, S, H, D]; cos, sin: [B or 1, S, D]. Returns [B, S, H, D].
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_ROPE_H_
