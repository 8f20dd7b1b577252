#include "testing/fsdp_util.h"

#include <cmath>
#include <cstdlib>
#include <memory>

#include <torch/csrc/autograd/grad_mode.h>

#include "gtest/gtest.h"

namespace tpudist::test_support {

fsdp::DeviceMesh MakeMesh(const Rank& r) {
  absl::StatusOr<fsdp::DeviceMesh> mesh = fsdp::InitDeviceMesh("cpu", {r.world_size}, {"dp"}, r.env);
  if (!mesh.ok()) {
    ADD_FAILURE() << mesh.status();
    std::abort();
  }
  return *mesh;
}

MlpImpl::MlpImpl(int64_t in, int64_t hidden, int64_t out) {
  fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
  fc2 = register_module("fc2", torch::nn::Linear(hidden, out));
}

at::Tensor MlpImpl::forward(const at::Tensor& x) {
  return RunForward(x, [&](const at::Tensor& in) { return fc2(at::tanh(fc1(in))); });
}

MlpStackImpl::MlpStackImpl() {
  b0 = register_module("b0", Mlp(5, 7, 6));
  b1 = register_module("b1", Mlp(6, 9, 6));  // 9 rows: uneven over 2, 4
  b2 = register_module("b2", Mlp(6, 3, 6));  // 3 rows: empty shard on rank 3
  head = register_module("head", torch::nn::Linear(6, 3));
}

at::Tensor MlpStackImpl::forward(const at::Tensor& x) {
  return RunForward(x, [&](const at::Tensor& in) { return head(b2(b1(b0(in)))); });
}

AttentionImpl::AttentionImpl(int64_t d) {
  // No qkv bias: the key bias has a mathematically zero gradient (softmax is
  // shift-invariant), so its grad is rounding noise that AdamW amplifies to
  // +-lr steps, and no two summation orders would agree on it.
  qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(d, 3 * d).bias(false)));
  proj = register_module("proj", torch::nn::Linear(d, d));
}

at::Tensor AttentionImpl::forward(const at::Tensor& x) {
  return RunForward(x, [&](const at::Tensor& in) {
    const int64_t d = in.size(-1), s = in.size(1);
    std::vector<at::Tensor> parts = qkv(in).split(d, -1);
    at::Tensor scores = at::matmul(parts[0], parts[1].transpose(1, 2)) / std::sqrt(double(d));
    at::Tensor mask = at::ones({s, s}, at::kBool).triu(1);
    scores = scores.masked_fill(mask, -1e9);
    return proj(at::matmul(at::softmax(scores, -1), parts[2]));
  });
}

BlockImpl::BlockImpl(int64_t vocab, int64_t d) {
  embed = register_parameter("embed", at::randn({vocab, d}) * 0.5);
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  attn = register_module("attn", Attention(d));
  mlp = register_module("mlp", Mlp(d, 2 * d + 1, d));
}

at::Tensor BlockImpl::forward(const at::Tensor& tokens) {
  return RunForward(tokens, [&](const at::Tensor& t) {
    at::Tensor h = embed.index_select(0, t.flatten()).view({t.size(0), t.size(1), -1});
    h = h + attn(ln1(h));
    return h + mlp(ln2(h));
  });
}

void CopyParams(torch::nn::Module& src, torch::nn::Module& dst) {
  at::NoGradGuard ng;
  auto s = src.named_parameters();
  auto d = dst.named_parameters();
  for (const auto& item : s) d[item.key()].copy_(item.value());
}

double RelErr(const at::Tensor& a, const at::Tensor& b) {
  const double denom = std::max(b.abs().max().item<double>(), 1e-12);
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / denom;
}

}  // namespace tpudist::test_support
