#include "models/gemma/rms_norm.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/autograd.h>

namespace tpudist::models::gemma {
namespace {

// One autograd node for the whole norm instead of the ~8 (pow, mean, add,
// pow, mul, mul, casts) that the composite formula records, with hand loops
// where they pay (the tiny training model runs ~45 norms a step on 64-wide
// rows, so per-op overhead dominates):
//   r = (mean(x^2) + eps)^-0.5, xhat = x * r, y = xhat * w
//   dw = sum over rows of dy * xhat
//   dx = r * (g - xhat * mean(g * xhat)),  g = dy * w
// Forward: r by HF's ops in HF's order (pow(2), mean, + eps, pow(-0.5)),
// then one loop for y = (x * r) * w -- the same two roundings as the
// composite's two muls, so y is bit-identical to it. Backward: one pass per
// row recomputing xhat (bit-identical to the forward's), no saved xhat.
// Two Function classes because autograd::Function takes no undefined tensor
// inputs: one with the weight, one without (the V norm).

// Rows per block of the backward: blocks run in parallel (at::parallel_for)
// and each sums its own dw partial; the partials are added in block order,
// so dw does not depend on the thread count.
constexpr int64_t kRowsPerBlock = 256;

// The row loops, compiled at -O3 (CMakeLists.txt) for AVX2 and the baseline
// (target_clones; neither contracts to FMA, so both round alike). Pointers
// are to contiguous fp32 rows of `d`; `w` may be null (no scale).

// y[i, :] = (x[i, :] * r[i]) * w  for `n` rows.
__attribute__((target_clones("avx2", "default"))) void ScaleRows(const float* x, const float* r, const float* w,
                                                                   int64_t n, int64_t d, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float ri = r[i];
    const float* xi = x + i * d;
    float* yi = y + i * d;
    if (w != nullptr) {
      for (int64_t j = 0; j < d; ++j) yi[j] = (xi[j] * ri) * w[j];
    } else {
      for (int64_t j = 0; j < d; ++j) yi[j] = xi[j] * ri;
    }
  }
}

// Eight floats (GCC vector extension: lane-wise IEEE ops, AVX2 or two SSE
// registers per clone); unaligned loads and stores through memcpy. The
// helpers are always inlined, so the vector-return ABI note is moot.
#pragma GCC diagnostic ignored "-Wpsabi"  // to the end of the file: GCC reports it there
typedef float Float8 __attribute__((vector_size(32)));
typedef double Double8 __attribute__((vector_size(64)));
__attribute__((always_inline)) inline Float8 Load8(const float* p) {
  Float8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
__attribute__((always_inline)) inline void Store8(float* p, Float8 v) { std::memcpy(p, &v, sizeof(v)); }

// One row of the backward: dx (null: skipped) and dw_acc += dy * xhat
// (null: skipped), xhat = x * ri; `kScaled`: g = dy * w, else g = dy.
template <bool kScaled>
__attribute__((always_inline)) inline void BackwardRow(const float* x, float ri, const float* dy, const float* w,
                                                       int64_t d, float inv_d, float* dx, double* dw_acc) {
  auto g8 = [&](int64_t j) { return kScaled ? Load8(dy + j) * Load8(w + j) : Load8(dy + j); };
  auto g1 = [&](int64_t j) { return kScaled ? dy[j] * w[j] : dy[j]; };
  Float8 acc = {};  // sum of g * xhat, eight interleaved partial sums
  int64_t j = 0;
  for (; j + 8 <= d; j += 8) acc += g8(j) * (Load8(x + j) * ri);
  for (; j < d; ++j) acc[0] += g1(j) * (x[j] * ri);
  const float dot = (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) * inv_d;
  if (dx != nullptr) {
    for (j = 0; j + 8 <= d; j += 8) Store8(dx + j, (g8(j) - (Load8(x + j) * ri) * dot) * ri);
    for (; j < d; ++j) dx[j] = (g1(j) - (x[j] * ri) * dot) * ri;
  }
  if (dw_acc != nullptr) {
    for (j = 0; j + 8 <= d; j += 8) {
      Double8 a;
      std::memcpy(&a, dw_acc + j, sizeof(a));
      a += __builtin_convertvector(Load8(dy + j) * (Load8(x + j) * ri), Double8);
      std::memcpy(dw_acc + j, &a, sizeof(a));
    }
    for (; j < d; ++j) dw_acc[j] += static_cast<double>(dy[j] * (x[j] * ri));
  }
}

// For `n` rows: dx[i, :] (null: skipped) and dw_acc[:] += dy * xhat (null:
// skipped), xhat = x * r[i].
__attribute__((target_clones("avx2", "default"))) void BackwardRows(const float* x, const float* r, const float* dy,
                                                                      const float* w, int64_t n, int64_t d,
                                                                      float* dx, double* dw_acc) {
  const float inv_d = d == 0 ? 0.0f : 1.0f / static_cast<float>(d);
  for (int64_t i = 0; i < n; ++i) {
    float* dxi = dx == nullptr ? nullptr : dx + i * d;
    if (w != nullptr) {
      BackwardRow<true>(x + i * d, r[i], dy + i * d, w, d, inv_d, dxi, dw_acc);
    } else {
      BackwardRow<false>(x + i * d, r[i], dy + i * d, w, d, inv_d, dxi, dw_acc);
    }
  }
}

// x: [..., dim] fp32; weight: [dim] fp32 or undefined. Returns y [..., dim];
// sets *xc (x made contiguous) and *r ([..., 1] fp32) for backward.
at::Tensor NormForward(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor* xc, at::Tensor* r) {
  // r from x as given: a mean's summation order follows x's layout.
  *r = at::pow(x.pow(2).mean(-1, /*keepdim=*/true) + eps, -0.5).contiguous();
  *xc = x.contiguous();
  at::Tensor y = at::empty_like(*xc);
  const int64_t d = xc->size(-1);
  const int64_t n = d == 0 ? 0 : xc->numel() / d;
  const float* xp = xc->data_ptr<float>();
  const float* rp = r->data_ptr<float>();
  const at::Tensor wc = weight.defined() ? weight.contiguous() : at::Tensor();
  const float* wp = wc.defined() ? wc.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, n, kRowsPerBlock, [&](int64_t begin, int64_t end) {
    ScaleRows(xp + begin * d, rp + begin, wp, end - begin, d, yp + begin * d);
  });
  return y;
}

// dy: [..., dim]; xc, r, weight as NormForward's. Returns {dx, dw} (fp32);
// each is left undefined when its `want_*` is false (dw also when weight
// is).
std::pair<at::Tensor, at::Tensor> NormBackward(const at::Tensor& dy, const at::Tensor& xc, const at::Tensor& r,
                                               const at::Tensor& weight, bool want_dx, bool want_dw) {
  at::Tensor dx, dw;
  if (!dy.defined()) return {dx, dw};
  want_dw = want_dw && weight.defined();
  if (!want_dx && !want_dw) return {dx, dw};
  const at::Tensor dyc = dy.to(at::kFloat).contiguous();
  const int64_t d = xc.size(-1);
  const int64_t n = d == 0 ? 0 : xc.numel() / d;
  const float* xp = xc.data_ptr<float>();
  const float* rp = r.data_ptr<float>();
  const float* gp = dyc.data_ptr<float>();
  const at::Tensor wc = weight.defined() ? weight.contiguous() : at::Tensor();
  const float* wp = wc.defined() ? wc.data_ptr<float>() : nullptr;
  if (want_dx) dx = at::empty_like(xc);
  float* dxp = want_dx ? dx.data_ptr<float>() : nullptr;
  const int64_t blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<double> partial(want_dw ? blocks * d : 0);  // [blocks, dim]
  at::parallel_for(0, blocks, 1, [&](int64_t b_begin, int64_t b_end) {
    for (int64_t b = b_begin; b < b_end; ++b) {
      const int64_t i = b * kRowsPerBlock;
      const int64_t rows = std::min(n, i + kRowsPerBlock) - i;
      BackwardRows(xp + i * d, rp + i, gp + i * d, wp, rows, d, dxp == nullptr ? nullptr : dxp + i * d,
                   want_dw ? partial.data() + b * d : nullptr);
    }
  });
  if (want_dw) {
    std::vector<double> sum(d, 0.0);
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t j = 0; j < d; ++j) sum[j] += partial[b * d + j];
    }
    dw = at::empty({d}, xc.options());
    float* dwp = dw.data_ptr<float>();
    for (int64_t j = 0; j < d; ++j) dwp[j] = static_cast<float>(sum[j]);
  }
  if (want_dx) dx = dx.to(dy.scalar_type());
  return {dx, dw};
}

class ScaledRmsNormFunction : public torch::autograd::Function<ScaledRmsNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps) {
    at::Tensor xc, r;
    at::Tensor y = NormForward(x, weight, eps, &xc, &r);
    ctx->save_for_backward({xc, r, weight});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    auto [dx, dw] = NormBackward(grads[0], saved[0], saved[1], saved[2], ctx->needs_input_grad(0),
                                 ctx->needs_input_grad(1));
    return {dx, dw, at::Tensor()};
  }
};

class UnscaledRmsNormFunction : public torch::autograd::Function<UnscaledRmsNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, double eps) {
    at::Tensor xc, r;
    at::Tensor y = NormForward(x, at::Tensor(), eps, &xc, &r);
    ctx->save_for_backward({xc, r});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    auto [dx, dw] = NormBackward(grads[0], saved[0], saved[1], at::Tensor(), ctx->needs_input_grad(0), false);
    return {dx, at::Tensor()};
  }
};

}  // namespace

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const bool fp32 = x.scalar_type() == at::kFloat && (!weight.defined() || weight.scalar_type() == at::kFloat);
  if (!fp32) {
    // Lower precision: the composite formula, so that the gradients round at
    // the same steps as transformers' (the bf16 FSDP2 oracle's 1e-2 bound
    // does not hold for the fused backward's fewer roundings).
    at::Tensor xf = x.to(at::kFloat);
    at::Tensor y = xf * at::pow(xf.pow(2).mean(-1, /*keepdim=*/true) + eps, -0.5);
    if (weight.defined()) y = y * weight.to(at::kFloat);
    return y.to(x.scalar_type());
  }
  return weight.defined() ? ScaledRmsNormFunction::apply(x, weight, eps) : UnscaledRmsNormFunction::apply(x, eps);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, bool with_scale) : eps_(eps) {
  if (with_scale) weight_ = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  return RunForward(x, [this](const at::Tensor& in) { return RmsNorm(in, weight_, eps_); });
}

}  // namespace tpudist::models::gemma
