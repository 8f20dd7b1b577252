// PositionTables (the cached RoPE tables and causal masks) and the model
// forward that uses them: a cached forward must equal a fresh model's at every
// sequence length and dtype; and the fused RmsNorm's gradients against
// torch autograd on the composite formula.
#include <tuple>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "models/gemma/attention_mask.h"
#include "models/gemma/gemma_config.h"
#include "models/gemma/gemma_model.h"
#include "models/gemma/position_tables.h"
#include "models/gemma/rms_norm.h"
#include "models/gemma/rope.h"

namespace tpudist::models::gemma {
namespace {

GemmaForCausalLM FreshModel(at::ScalarType dtype) {
  GemmaForCausalLM m(GemmaTinyConfig());
  InitGemmaWeights(*m, {/*seed=*/7, /*std=*/0.05, /*layer_scalar=*/1.0});
  m->to(dtype);
  return m;
}

// ids: [2, s] from a fixed generator, no padding token.
at::Tensor Ids(int64_t s) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
  return at::randint(3, GemmaTinyConfig().vocab_size, {2, s}, gen, at::kLong);
}

TEST(GemmaPositionTables, MatchesTheUncachedFormulasAndBroadcastsOverBatch) {
  const GemmaConfig c = GemmaTinyConfig();
  const int64_t s = 12;
  AttentionTables t = BuildAttentionTables(c, s, at::kFloat, at::kCPU);
  at::Tensor pos = at::arange(s, at::kLong).unsqueeze(0).expand({3, s});  // [3, S] as the model used to
  auto [cos, sin] = RopeCosSin(RopeInvFreq(c.sliding_rope, c.head_dim), pos, at::kFloat);
  EXPECT_EQ(t.cos_sliding.sizes(), (std::vector<int64_t>{1, s, c.head_dim}));
  EXPECT_TRUE(at::equal(t.cos_sliding.expand_as(cos), cos));
  EXPECT_TRUE(at::equal(t.sin_sliding.expand_as(sin), sin));
  auto [cos_f, sin_f] = RopeCosSin(RopeInvFreq(c.full_rope, c.global_head_dim), pos, at::kFloat);
  EXPECT_TRUE(at::equal(t.cos_full.expand_as(cos_f), cos_f));
  EXPECT_TRUE(at::equal(t.sin_full.expand_as(sin_f), sin_f));
  EXPECT_TRUE(at::equal(t.mask_sliding, AdditiveMask(VisibleMask(s, c.sliding_window, {}), at::kFloat)));
  EXPECT_TRUE(at::equal(t.mask_full, AdditiveMask(VisibleMask(s, std::nullopt, {}), at::kFloat)));
}

TEST(GemmaPositionTables, RebuildsOnlyWhenSeqLenDtypeOrDeviceChange) {
  PositionTables cache(GemmaTinyConfig());
  const at::Tensor first = cache.Get(8, at::kFloat, at::kCPU).cos_sliding;
  EXPECT_EQ(cache.builds(), 1);
  EXPECT_TRUE(cache.Get(8, at::kFloat, at::kCPU).cos_sliding.is_same(first));  // hit: same tensor
  EXPECT_EQ(cache.builds(), 1);
  const AttentionTables& longer = cache.Get(16, at::kFloat, at::kCPU);
  EXPECT_EQ(cache.builds(), 2);
  EXPECT_EQ(longer.cos_full.size(1), 16);
  EXPECT_EQ(longer.mask_full.size(3), 16);
  const AttentionTables& bf16 = cache.Get(16, at::kBFloat16, at::kCPU);
  EXPECT_EQ(cache.builds(), 3);
  EXPECT_EQ(bf16.sin_sliding.scalar_type(), at::kBFloat16);
  EXPECT_EQ(bf16.mask_sliding.scalar_type(), at::kBFloat16);
  // Back to the first key: rebuilt (one entry), equal to the first build.
  EXPECT_TRUE(at::equal(cache.Get(8, at::kFloat, at::kCPU).cos_sliding, first));
  EXPECT_EQ(cache.builds(), 4);
}

TEST(GemmaPositionTables, ModelAtAnotherSeqLenEqualsAFreshModel) {
  GemmaForCausalLM warm = FreshModel(at::kFloat);
  at::NoGradGuard no_grad;
  warm->forward(Ids(16));  // fills the cache at S = 16
  for (int64_t s : {9, 16, 5}) {
    GemmaForCausalLM fresh = FreshModel(at::kFloat);
    at::Tensor want = fresh->forward(Ids(s)).logits;  // [2, S, V]
    at::Tensor got = warm->forward(Ids(s)).logits;
    ASSERT_EQ(got.sizes(), want.sizes()) << "S " << s;
    EXPECT_TRUE(at::equal(got, want)) << "S " << s << " max diff " << (got - want).abs().max().item<float>();
  }
}

TEST(GemmaPositionTables, ModelAfterADtypeSwitchEqualsAFreshModel) {
  GemmaForCausalLM model = FreshModel(at::kFloat);
  at::NoGradGuard no_grad;
  model->forward(Ids(12));  // fp32 tables cached
  model->to(at::kBFloat16);
  GemmaForCausalLM fresh = FreshModel(at::kBFloat16);
  at::Tensor want = fresh->forward(Ids(12)).logits;
  at::Tensor got = model->forward(Ids(12)).logits;
  EXPECT_TRUE(at::equal(got, want)) << "max diff " << (got - want).abs().max().item<float>();
  // And back: fp32 again matches a fresh fp32 model of the bf16-rounded weights.
  model->to(at::kFloat);
  fresh->to(at::kFloat);
  EXPECT_TRUE(at::equal(model->forward(Ids(12)).logits, fresh->forward(Ids(12)).logits));
}

TEST(GemmaPositionTables, PaddingMaskIsNotCached) {
  GemmaForCausalLM model = FreshModel(at::kFloat);
  at::NoGradGuard no_grad;
  at::Tensor ids = Ids(10);
  at::Tensor pad = at::ones({2, 10}, at::kLong);
  pad[0].narrow(0, 0, 3).zero_();  // left padding on row 0
  at::Tensor padded = model->forward(ids, pad).logits;
  at::Tensor plain = model->forward(ids).logits;  // same S and dtype: a cache hit
  GemmaForCausalLM fresh = FreshModel(at::kFloat);
  EXPECT_TRUE(at::equal(plain, fresh->forward(ids).logits));
  EXPECT_TRUE(at::equal(padded, fresh->forward(ids, pad).logits));
  EXPECT_FALSE(at::equal(padded[0], plain[0]));  // the padding did change row 0
}

// The composite formula (HF's Gemma4RMSNorm), differentiated by autograd.
at::Tensor CompositeRmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor y = xf * at::pow(xf.pow(2).mean(-1, true) + eps, -0.5);
  if (w.defined()) y = y * w.to(at::kFloat);
  return y.to(x.scalar_type());
}

class GemmaRmsNormGrad : public ::testing::TestWithParam<std::tuple<at::ScalarType, bool>> {};

TEST_P(GemmaRmsNormGrad, MatchesAutogradOfTheCompositeFormula) {
  const auto [dtype, with_weight] = GetParam();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  at::Tensor x0 = at::randn({3, 5, 16}, gen).to(dtype);      // [.., dim]
  at::Tensor w0 = (at::randn({16}, gen) + 1.0).to(dtype);    // [dim]
  at::Tensor dy = at::randn({3, 5, 16}, gen).to(dtype);
  auto run = [&](bool fused) {
    at::Tensor x = x0.clone().requires_grad_(true);
    at::Tensor w = with_weight ? w0.clone().requires_grad_(true) : at::Tensor();
    at::Tensor y = fused ? RmsNorm(x, w, 1e-6) : CompositeRmsNorm(x, w, 1e-6);
    y.backward(dy);
    return std::make_tuple(y.detach(), x.grad(), with_weight ? w.grad() : at::Tensor());
  };
  auto [y1, dx1, dw1] = run(true);
  auto [y2, dx2, dw2] = run(false);
  EXPECT_TRUE(at::equal(y1, y2));  // same forward ops in the same order
  const double tol = dtype == at::kBFloat16 ? 2e-2 : 1e-5;
  EXPECT_TRUE(at::allclose(dx1.to(at::kFloat), dx2.to(at::kFloat), tol, tol))
      << "max diff " << (dx1 - dx2).abs().max().item<float>();
  EXPECT_EQ(dx1.scalar_type(), dtype);
  if (with_weight) {
    EXPECT_TRUE(at::allclose(dw1.to(at::kFloat), dw2.to(at::kFloat), tol, tol))
        << "max diff " << (dw1 - dw2).abs().max().item<float>();
    EXPECT_EQ(dw1.scalar_type(), dtype);
  }
}

// The fp32 hand loops on more rows than one backward block (ragged last
// block), a non-contiguous input and gradient, and rows of 64 and 67
// (the eight-way dot product's tail): y bit-identical, gradients close.
TEST(GemmaRmsNormLoops, ManyRowsAndStridedInputsMatchTheCompositeFormula) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  for (int64_t dim : {64, 67}) {
    for (bool with_weight : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim << (with_weight ? " scaled" : " unscaled"));
      at::Tensor base = at::randn({dim, 2, 300}, gen) * 3.0;   // [dim, 2, 300]
      at::Tensor w0 = at::randn({dim}, gen) + 1.0;             // [dim]
      at::Tensor dy = at::randn({300, 2, dim}, gen).transpose(0, 1);  // [2, 300, dim], strided
      auto run = [&](bool fused) {
        at::Tensor leaf = base.clone().requires_grad_(true);
        at::Tensor x = leaf.permute({1, 2, 0});  // [2, 300, dim], not contiguous
        at::Tensor w = with_weight ? w0.clone().requires_grad_(true) : at::Tensor();
        at::Tensor y = fused ? RmsNorm(x, w, 1e-6) : CompositeRmsNorm(x, w, 1e-6);
        y.backward(dy);
        return std::make_tuple(y.detach(), leaf.grad(), with_weight ? w.grad() : at::Tensor());
      };
      auto [y1, dx1, dw1] = run(true);
      auto [y2, dx2, dw2] = run(false);
      EXPECT_TRUE(at::equal(y1, y2));
      EXPECT_TRUE(at::allclose(dx1, dx2, 1e-5, 1e-5)) << "max diff " << (dx1 - dx2).abs().max().item<float>();
      if (with_weight) {
        EXPECT_TRUE(at::allclose(dw1, dw2, 1e-5, 1e-4)) << "max diff " << (dw1 - dw2).abs().max().item<float>();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DtypesAndScale, GemmaRmsNormGrad,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kBFloat16), ::testing::Bool()));

}  // namespace
}  // namespace tpudist::models::gemma
