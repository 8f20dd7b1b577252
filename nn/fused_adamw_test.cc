// FusedAdamW against libtorch's own torch::optim::AdamW (the oracle): same
// parameters, grads and options, several steps, to float rounding.
#include "nn/fused_adamw.h"

#include <sstream>
#include <vector>

#include <torch/torch.h>

#include "gtest/gtest.h"

namespace tpudist::nn {
namespace {

// Three parameters of different shapes; the third gets no grad on odd steps.
std::vector<at::Tensor> MakeParams(uint64_t seed) {
  at::manual_seed(seed);
  return {at::randn({5, 7}).requires_grad_(), at::randn({3}).requires_grad_(),
          at::randn({2, 3, 4}).requires_grad_()};
}

void SetGrads(std::vector<at::Tensor>& params, int step) {
  at::manual_seed(100 + step);
  for (size_t i = 0; i < params.size(); ++i) {
    if (i == 2 && step % 2 == 1) {
      params[i].mutable_grad() = at::Tensor();
      continue;
    }
    params[i].mutable_grad() = at::randn(params[i].sizes());
  }
}

void ExpectSame(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, int step) {
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::allclose(a[i], b[i], 1e-6, 1e-7))
        << "step " << step << " param " << i << " max diff "
        << (a[i] - b[i]).abs().max().item<double>();
  }
}

class FusedAdamWTest : public ::testing::TestWithParam<bool> {};  // amsgrad

TEST_P(FusedAdamWTest, MatchesTorchAdamW) {
  auto opts = torch::optim::AdamWOptions(3e-2).weight_decay(0.1).amsgrad(GetParam());
  std::vector<at::Tensor> ours = MakeParams(1), theirs = MakeParams(1);
  FusedAdamW fused(ours, opts);
  torch::optim::AdamW ref(theirs, opts);
  for (int step = 0; step < 6; ++step) {
    SetGrads(ours, step);
    SetGrads(theirs, step);
    fused.step();
    ref.step();
    ExpectSame(ours, theirs, step);
  }
  // The state is AdamW's: same step counts and moments.
  for (size_t i = 0; i < ours.size(); ++i) {
    const auto& a = static_cast<torch::optim::AdamWParamState&>(
        *fused.state().at(ours[i].unsafeGetTensorImpl()));
    const auto& b = static_cast<torch::optim::AdamWParamState&>(
        *ref.state().at(theirs[i].unsafeGetTensorImpl()));
    EXPECT_EQ(a.step(), b.step()) << i;
    EXPECT_TRUE(at::allclose(a.exp_avg_sq(), b.exp_avg_sq(), 1e-6, 1e-9)) << i;
  }
}

TEST_P(FusedAdamWTest, ResumesFromAnAdamWCheckpoint) {
  auto opts = torch::optim::AdamWOptions(1e-2).weight_decay(0.01).amsgrad(GetParam());
  std::vector<at::Tensor> ours = MakeParams(2), theirs = MakeParams(2);
  torch::optim::AdamW first(ours, opts), ref(theirs, opts);
  for (int step = 0; step < 3; ++step) {
    SetGrads(ours, step);
    SetGrads(theirs, step);
    first.step();
    ref.step();
  }
  std::stringstream saved;
  torch::serialize::OutputArchive out;
  first.save(out);
  out.save_to(saved);
  FusedAdamW fused(ours, opts);
  torch::serialize::InputArchive in;
  in.load_from(saved);
  fused.load(in);  // step counts 3 (2 for the third) must reach the kernel
  for (int step = 3; step < 6; ++step) {
    SetGrads(ours, step);
    SetGrads(theirs, step);
    fused.step();
    ref.step();
    ExpectSame(ours, theirs, step);
  }
}

INSTANTIATE_TEST_SUITE_P(Amsgrad, FusedAdamWTest, ::testing::Bool());

}  // namespace
}  // namespace tpudist::nn
