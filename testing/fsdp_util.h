// Test harness for fully_shard_test (and the checkpoint tests): N ranks as
// threads over one HashStore,
// each with a 1-D DeviceMesh whose group is a ProcessGroupTpuDist (shared
// memory; it implements _reduce_scatter_base, which Gloo 1.13 lacks), plus
// small HookableModule models. Test-only.
#ifndef TPU_DIST_TESTING_FSDP_UTIL_H_
#define TPU_DIST_TESTING_FSDP_UTIL_H_

#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "absl/time/time.h"
#include "fsdp/device_mesh.h"
#include "testing/device_mesh_ranks.h"
#include "nn/module_hooks.h"

namespace tpudist::test_support {

// Ranks run as threads through testing/device_mesh_ranks.h (on tpu_dist,
// which implements _reduce_scatter_base; Gloo 1.13 does not).
using Rank = RankContext;

// The 1-D mesh over all ranks; fails the test on error.
fsdp::DeviceMesh MakeMesh(const Rank& r);

// A two-layer perceptron block: fc2(tanh(fc1(x))). x: [B, in] -> [B, out].
class MlpImpl : public nn::HookableModule {
 public:
  MlpImpl(int64_t in, int64_t hidden, int64_t out);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

// Three Mlp blocks and a head: the "small MLP" of the parity tests.
// x: [B, 5] -> [B, 3]
class MlpStackImpl : public nn::HookableModule {
 public:
  MlpStackImpl();
  at::Tensor forward(const at::Tensor& x);
  Mlp b0{nullptr}, b1{nullptr}, b2{nullptr};
  torch::nn::Linear head{nullptr};  // weight [3, 6]
};
TORCH_MODULE(MlpStack);

// Single-head causal self-attention. x: [B, S, D] -> [B, S, D].
class AttentionImpl : public nn::HookableModule {
 public:
  explicit AttentionImpl(int64_t d);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(Attention);

// Pre-norm transformer block with a per-token embedding table that is
// frozen in some tests. tokens: [B, S] (long) -> [B, S, D].
class BlockImpl : public nn::HookableModule {
 public:
  BlockImpl(int64_t vocab, int64_t d);
  at::Tensor forward(const at::Tensor& tokens);
  at::Tensor embed;  // [vocab, d]
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

// Copies every parameter of `src` into `dst` (same structure).
void CopyParams(torch::nn::Module& src, torch::nn::Module& dst);

// max |a - b| / max(|b|, tiny) over all elements.
double RelErr(const at::Tensor& a, const at::Tensor& b);

}  // namespace tpudist::test_support

#endif  // TPU_DIST_TESTING_FSDP_UTIL_H_
