#include "models/gemma/rope.h"

#include <cmath>
#include <vector>

#include <c10/util/Exception.h>

namespace tpudist::models::gemma {

at::Tensor RopeInvFreq(const RopeParameters& params, int64_t head_dim) {
  TORCH_CHECK(head_dim > 0 && head_dim % 2 == 0, "RopeInvFreq: head_dim must be even, got ", head_dim);
  const int64_t half = head_dim / 2;
  int64_t rotated = half;
  if (params.rope_type == "proportional") {
    rotated = static_cast<int64_t>(std::floor(params.partial_rotary_factor * head_dim / 2.0));
  } else {
    TORCH_CHECK(params.rope_type == "default", "RopeInvFreq: unknown rope_type ", params.rope_type);
  }
  at::Tensor inv = at::zeros({half}, at::kFloat);
  // Same op order as HF: exponent = arange(0, D, 2) / D computed in fp32.
  at::Tensor exponent = at::arange(0, 2 * rotated, 2, at::kLong).to(at::kFloat) / static_cast<double>(head_dim);
  inv.narrow(0, 0, rotated).copy_(1.0 / at::pow(params.rope_theta, exponent));
  // HF divides the whole proportional vector (zeros included) by `factor`.
  if (params.rope_type == "proportional" && params.factor != 1.0) inv.div_(params.factor);
  return inv;
}

std::pair<at::Tensor, at::Tensor> RopeCosSin(const at::Tensor& inv_freq, const at::Tensor& positions,
                                             at::ScalarType dtype) {
  at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq.to(at::kFloat);  // [B, S, D/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);                                           // [B, S, D]
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.narrow(-1, 0, half);
  at::Tensor x2 = x.narrow(-1, half, half);
  return at::cat({-x2, x1}, -1);
}

at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // rotate_half(x) * sin == swap_halves(x) * (sign * sin) with sign = -1 on
  // the first half, +1 on the second: bit-identical (negation is exact) but
  // the sign lands on the small [B or 1, S, D] table, and swapping the halves
  // is one flip of a [..., 2, D/2] view instead of narrow + neg + cat (whose
  // backward allocates and fills a zero tensor per slice).
  const int64_t d = x.size(-1), half = d / 2;
  at::Tensor c = cos.unsqueeze(2);  // [B or 1, S, 1, D]
  at::Tensor signed_sin = at::cat({-sin.narrow(-1, 0, half), sin.narrow(-1, half, half)}, -1).unsqueeze(2);
  std::vector<int64_t> split(x.sizes().begin(), x.sizes().end() - 1);  // [..., 2, D/2]
  split.push_back(2);
  split.push_back(half);
  at::Tensor swapped = x.reshape(split).flip({-2}).reshape(x.sizes());  // (x1, x2) -> (x2, x1)
  return x * c + swapped * signed_sin;
}

}  // namespace tpudist::models::gemma
