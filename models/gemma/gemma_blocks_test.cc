// Unit tests of the building blocks against hand-computed small cases.
#include <cmath>

#include <gtest/gtest.h>

#include "models/gemma/attention_mask.h"
#include "models/gemma/gemma_attention.h"
#include "models/gemma/gemma_config.h"
#include "models/gemma/rms_norm.h"
#include "models/gemma/rope.h"

namespace tpudist::models::gemma {
namespace {

TEST(RmsNorm, MatchesHandComputation) {
  at::Tensor x = at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 4});
  at::Tensor w = at::tensor({1.0f, 2.0f, 1.0f, 0.5f});
  const double eps = 1e-6;
  const double inv = 1.0 / std::sqrt(7.5 + eps);  // mean(1,4,9,16) = 7.5
  at::Tensor y = RmsNorm(x, w, eps);
  const float want[] = {float(1 * inv * 1), float(2 * inv * 2), float(3 * inv * 1), float(4 * inv * 0.5)};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[0][i].item<float>(), want[i], 1e-6) << i;
  // No scale: plain normalisation (v_norm).
  at::Tensor y2 = RmsNorm(x, at::Tensor(), eps);
  EXPECT_NEAR(y2[0][3].item<float>(), 4 * inv, 1e-6);
}

TEST(RmsNorm, ModuleKeepsDtypeAndUsesPlainWeight) {
  RMSNorm norm(4, 1e-6);
  EXPECT_TRUE(norm->with_scale());
  EXPECT_TRUE(at::equal(norm->weight(), at::ones({4})));  // ones, not zeros as in (1 + w)
  at::Tensor x = at::tensor({1.0f, -1.0f, 1.0f, -1.0f}).to(at::kBFloat16);
  at::Tensor y = norm->forward(x);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_NEAR(y[1].item<float>(), -1.0f, 1e-2);
  RMSNorm v_norm(4, 1e-6, /*with_scale=*/false);
  EXPECT_EQ(v_norm->parameters().size(), 0u);
}

TEST(Rope, DefaultInvFreq) {
  at::Tensor inv = RopeInvFreq({"default", 10000.0, 1.0}, 4);
  ASSERT_EQ(inv.numel(), 2);
  EXPECT_FLOAT_EQ(inv[0].item<float>(), 1.0f);
  EXPECT_NEAR(inv[1].item<float>(), 0.01f, 1e-7);  // 1e4^(-2/4)
}

TEST(Rope, ProportionalInvFreqE2B) {
  // head_dim 512, factor 0.25: 64 rotated frequencies, exponent over 512.
  at::Tensor inv = RopeInvFreq({"proportional", 1e6, 0.25}, 512);
  ASSERT_EQ(inv.numel(), 256);
  EXPECT_FLOAT_EQ(inv[0].item<float>(), 1.0f);
  EXPECT_NEAR(inv[63].item<float>(), std::pow(1e6, -126.0 / 512.0), 1e-9);
  EXPECT_GT(inv[63].item<float>(), 0.0f);
  EXPECT_EQ(inv.narrow(0, 64, 192).abs().sum().item<float>(), 0.0f);
}

TEST(Rope, ApplyRotatesHalvesByHand) {
  // D = 4, one head, one position p = 3. Pairs (0, 2) and (1, 3).
  at::Tensor inv = RopeInvFreq({"default", 10000.0, 1.0}, 4);
  at::Tensor pos = at::full({1, 1}, 3, at::kLong);
  auto [cos, sin] = RopeCosSin(inv, pos, at::kFloat);
  at::Tensor x = at::tensor({0.5f, -1.0f, 2.0f, 0.25f}).view({1, 1, 1, 4});
  at::Tensor y = ApplyRope(x, cos, sin).view({4});
  const double a0 = 3.0, a1 = 0.03;
  EXPECT_NEAR(y[0].item<float>(), 0.5 * std::cos(a0) - 2.0 * std::sin(a0), 1e-6);
  EXPECT_NEAR(y[2].item<float>(), 2.0 * std::cos(a0) + 0.5 * std::sin(a0), 1e-6);
  EXPECT_NEAR(y[1].item<float>(), -1.0 * std::cos(a1) - 0.25 * std::sin(a1), 1e-6);
  EXPECT_NEAR(y[3].item<float>(), 0.25 * std::cos(a1) + -1.0 * std::sin(a1), 1e-6);
}

TEST(Rope, ProportionalPassesThroughUnrotatedDims) {
  // D = 16, factor 0.25 -> 2 rotated pairs: (0, 8) and (1, 9).
  at::Tensor inv = RopeInvFreq({"proportional", 1e6, 0.25}, 16);
  EXPECT_NEAR(inv[1].item<float>(), std::pow(1e6, -2.0 / 16.0), 1e-7);
  at::Tensor pos = at::full({1, 1}, 5, at::kLong);
  auto [cos, sin] = RopeCosSin(inv, pos, at::kFloat);
  at::Tensor x = at::randn({1, 1, 2, 16});
  at::Tensor y = ApplyRope(x, cos, sin);
  for (int j = 2; j < 8; ++j) {
    EXPECT_TRUE(at::allclose(y.select(-1, j), x.select(-1, j))) << j;
    EXPECT_TRUE(at::allclose(y.select(-1, j + 8), x.select(-1, j + 8))) << j + 8;
  }
  EXPECT_FALSE(at::allclose(y.select(-1, 0), x.select(-1, 0)));
  at::Tensor want0 = x.select(-1, 0) * std::cos(5.0) - x.select(-1, 8) * std::sin(5.0);
  EXPECT_TRUE(at::allclose(y.select(-1, 0), want0, 1e-5, 1e-6));
}

TEST(Rope, CosSinCastToActivationDtype) {
  at::Tensor inv = RopeInvFreq({"default", 10000.0, 1.0}, 8);
  auto [cos, sin] = RopeCosSin(inv, at::arange(4, at::kLong).view({1, 4}), at::kBFloat16);
  EXPECT_EQ(cos.scalar_type(), at::kBFloat16);
  EXPECT_EQ(cos.sizes(), (std::vector<int64_t>{1, 4, 8}));
}

TEST(AttentionMask, SlidingWindowBoundary) {
  // window 3: query q sees q-2, q-1, q.
  at::Tensor m = VisibleMask(6, 3, at::Tensor()).view({6, 6});
  for (int q = 0; q < 6; ++q) {
    for (int k = 0; k < 6; ++k) {
      const bool want = k <= q && k > q - 3;
      EXPECT_EQ(m[q][k].item<bool>(), want) << q << "," << k;
    }
  }
  EXPECT_FALSE(m[4][1].item<bool>());  // exactly window tokens back: hidden
  EXPECT_TRUE(m[4][2].item<bool>());
}

TEST(AttentionMask, CausalWithPadding) {
  at::Tensor pad = at::tensor(std::vector<int64_t>{0, 1, 1, 1, 1, 1, 1, 0}).view({2, 4});
  at::Tensor m = VisibleMask(4, std::nullopt, pad);
  ASSERT_EQ(m.sizes(), (std::vector<int64_t>{2, 1, 4, 4}));
  EXPECT_FALSE(m[0][0][2][0].item<bool>());  // padded key hidden
  EXPECT_TRUE(m[0][0][2][1].item<bool>());
  EXPECT_FALSE(m[0][0][1][2].item<bool>());  // future hidden
  EXPECT_FALSE(m[1][0][3][3].item<bool>());  // padded key at the end
  EXPECT_TRUE(m[1][0][3][2].item<bool>());
  at::Tensor add = AdditiveMask(m, at::kBFloat16);
  EXPECT_EQ(add.scalar_type(), at::kBFloat16);
  EXPECT_EQ(add[0][0][2][1].item<float>(), 0.0f);
  EXPECT_LT(add[0][0][2][0].item<float>(), -1e38f);
}

TEST(Config, KvSourceLayers) {
  GemmaConfig e2b = GemmaE2BConfig();
  ASSERT_TRUE(e2b.Validate().ok());
  EXPECT_EQ(e2b.FirstKvSharedLayer(), 15);
  EXPECT_EQ(e2b.KvSourceLayer(15), 13);
  EXPECT_EQ(e2b.KvSourceLayer(19), 14);
  EXPECT_EQ(e2b.KvSourceLayer(34), 14);
  EXPECT_EQ(e2b.KvSourceLayer(7), 7);
  EXPECT_TRUE(e2b.StoresSharedKv(13));
  EXPECT_TRUE(e2b.StoresSharedKv(14));
  EXPECT_FALSE(e2b.StoresSharedKv(12));
  EXPECT_EQ(e2b.IntermediateSize(14), 6144);
  EXPECT_EQ(e2b.IntermediateSize(15), 12288);
  EXPECT_EQ(e2b.HeadDim(4), 512);
  EXPECT_EQ(e2b.HeadDim(5), 256);
  GemmaConfig tiny = GemmaTinyConfig();
  ASSERT_TRUE(tiny.Validate().ok());
  EXPECT_EQ(tiny.KvSourceLayer(4), 3);
  EXPECT_EQ(tiny.KvSourceLayer(5), 2);
}

TEST(Attention, RepeatKv) {
  at::Tensor k = at::arange(2 * 1 * 3 * 2, at::kFloat).view({2, 1, 3, 2});
  at::Tensor r = RepeatKv(k, 4);
  ASSERT_EQ(r.sizes(), (std::vector<int64_t>{2, 4, 3, 2}));
  for (int h = 0; h < 4; ++h) EXPECT_TRUE(at::equal(r.select(1, h), k.select(1, 0)));
}

// The shared layer must attend with exactly the K/V stored by its source
// layer: replace the stored K/V and compare against a hand computation.
TEST(Attention, SharedLayerReusesStoredKv) {
  GemmaConfig c = GemmaTinyConfig();
  GemmaAttention source(c, 3), shared_layer(c, 4);
  EXPECT_FALSE(source->is_kv_shared());
  EXPECT_TRUE(shared_layer->is_kv_shared());
  EXPECT_TRUE(shared_layer->k_proj.is_empty());
  for (const auto& p : shared_layer->named_parameters()) {
    EXPECT_EQ(p.key().find("k_proj"), std::string::npos) << p.key();
    EXPECT_EQ(p.key().find("v_proj"), std::string::npos) << p.key();
  }
  const int64_t b = 1, s = 5, d = c.head_dim;
  at::Tensor x = at::randn({b, s, c.hidden_size});
  at::Tensor pos = at::arange(s, at::kLong).view({1, s});
  auto [cos, sin] = RopeCosSin(RopeInvFreq(c.sliding_rope, d), pos, at::kFloat);
  at::Tensor mask = AdditiveMask(VisibleMask(s, c.sliding_window, at::Tensor()), at::kFloat);
  SharedKv kv;
  source->forward(x, cos, sin, mask, &kv);
  ASSERT_TRUE(kv.sliding_k.defined());
  EXPECT_FALSE(kv.full_k.defined());
  EXPECT_EQ(kv.sliding_k.sizes(), (std::vector<int64_t>{b, 1, s, d}));
  kv.sliding_k = at::randn({b, 1, s, d});
  kv.sliding_v = at::randn({b, 1, s, d});
  at::Tensor got = shared_layer->forward(x, cos, sin, mask, &kv);
  // Hand computation from the layer's own q path and the replaced K/V.
  at::Tensor q = at::matmul(x, shared_layer->q_proj->weight.t()).view({b, s, c.num_attention_heads, d});
  q = ApplyRope(RmsNorm(q, shared_layer->q_norm->weight(), c.rms_norm_eps), cos, sin).transpose(1, 2);
  at::Tensor sc = at::matmul(q, kv.sliding_k.transpose(2, 3)) + mask;
  at::Tensor o = at::matmul(at::softmax(sc, -1), kv.sliding_v).transpose(1, 2).reshape({b, s, -1});
  at::Tensor want = at::matmul(o, shared_layer->o_proj->weight.t());
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5));
  // A shared layer without a stored source fails loudly.
  SharedKv empty;
  EXPECT_THROW(shared_layer->forward(x, cos, sin, mask, &empty), c10::Error);
}

}  // namespace
}  // namespace tpudist::models::gemma
