#include "train/nonfinite_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace tpudist::train {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Parameters with gradients g (one value per element).
std::vector<at::Tensor> ParamsWithGrads(const std::vector<std::vector<float>>& grads) {
  std::vector<at::Tensor> out;
  for (const auto& g : grads) {
    at::Tensor p = at::zeros({static_cast<int64_t>(g.size())}, at::kFloat);  // [n]
    p.mutable_grad() = at::tensor(g, at::kFloat);                            // [n]
    out.push_back(p);
  }
  return out;
}

// What the all-reduce SUM gives: the ranks' packed tensors added.
at::Tensor Sum(const std::vector<at::Tensor>& per_rank) {
  at::Tensor s = at::zeros_like(per_rank[0]);
  for (const at::Tensor& t : per_rank) s += t;
  return s;
}

std::string Msg(const NonFiniteVerdict& v) { return std::string(v.error.message()); }

TEST(NonFiniteCheckTest, MeasureStepNormsAndFirstBadGradient) {
  std::vector<at::Tensor> p = ParamsWithGrads({{3.0f}, {4.0f, 0.0f}});
  StepNumerics s = MeasureStep(1.5, p);
  EXPECT_EQ(s.loss, 1.5);
  EXPECT_DOUBLE_EQ(s.grad_norm, 5.0);
  EXPECT_EQ(s.first_bad_grad, -1);

  p = ParamsWithGrads({{1.0f}, {2.0f}, {std::nanf(""), 1.0f}, {INFINITY}});
  p.insert(p.begin() + 1, at::zeros({2}, at::kFloat));  // no gradient: skipped, index kept
  s = MeasureStep(0.5, p);
  EXPECT_TRUE(std::isnan(s.grad_norm));
  EXPECT_EQ(s.first_bad_grad, 3);
  // A norm past fp32's range is inf (torch's clip_grad_norm_ says the same).
  s = MeasureStep(0.5, ParamsWithGrads({{3e38f, 3e38f}}));
  EXPECT_TRUE(std::isinf(s.grad_norm));
  EXPECT_EQ(s.first_bad_grad, 0);
}

TEST(NonFiniteCheckTest, AllFiniteIsOk) {
  const int64_t world = 4;
  std::vector<at::Tensor> packed;
  for (int64_t r = 0; r < world; ++r) packed.push_back(PackStepNumerics({2.0 + r, 1.0, -1}, r, world));
  NonFiniteVerdict v = CheckStepNumerics(Sum(packed), world, {1, 2, 3, 8}, {"a"});
  EXPECT_TRUE(v.ok()) << v.error;
  EXPECT_EQ(v.rank, -1);
}

// The sum carries each rank's values exactly, NaN and inf included, so every
// rank names the same rank and quantity: the loss before the gradient norm,
// the lowest rank first.
TEST(NonFiniteCheckTest, NamesFirstQuantityAndRankOnEveryRank) {
  const int64_t world = 4;
  std::vector<at::Tensor> packed = {PackStepNumerics({2.0, kInf, 0}, 0, world),
                                    PackStepNumerics({2.0, 1.0, -1}, 1, world),
                                    PackStepNumerics({kNan, kNan, 0}, 2, world),
                                    PackStepNumerics({-kInf, 1.0, -1}, 3, world)};
  NonFiniteVerdict v = CheckStepNumerics(Sum(packed), world, {1, 2, 3, 8}, {"w0", "w1"});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.rank, 2);
  EXPECT_EQ(v.error.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(v), AllOf(HasSubstr("non-finite loss at epoch 1/2, step 3/8 on rank 2: loss=nan"),
                            HasSubstr("(also on rank 3)"), HasSubstr("stopped before the optimizer step"),
                            HasSubstr("no checkpoint of this epoch")));

  // Finite losses: the gradient norm, with the first bad parameter's name.
  packed[2] = PackStepNumerics({2.0, 1.0, -1}, 2, world);
  packed[3] = PackStepNumerics({2.0, kNan, 1}, 3, world);
  v = CheckStepNumerics(Sum(packed), world, {2, 2, 1, 8}, {"w0", "model.layers.0.mlp.up_proj.weight"});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.rank, 0);
  EXPECT_THAT(Msg(v), AllOf(HasSubstr("non-finite gradient norm at epoch 2/2, step 1/8 on rank 0: grad_norm=inf"),
                            HasSubstr("(also on rank 3)"), HasSubstr("first in the gradient of w0"),
                            Not(HasSubstr("loss=nan"))));
  packed[0] = PackStepNumerics({2.0, 1.0, -1}, 0, world);
  v = CheckStepNumerics(Sum(packed), world, {2, 2, 1, 8}, {"w0", "model.layers.0.mlp.up_proj.weight"});
  EXPECT_EQ(v.rank, 3);
  EXPECT_THAT(Msg(v), HasSubstr("on rank 3: grad_norm=nan, first in the gradient of model.layers.0.mlp.up_proj"));
}

TEST(NonFiniteCheckTest, SavedTensors) {
  std::vector<at::Tensor> t = {at::ones({3}), at::Tensor(), at::arange(4, at::kLong), at::ones({2})};
  EXPECT_EQ(FirstNonFinite(t), -1);
  t[3][1] = std::nanf("");
  EXPECT_EQ(FirstNonFinite(t), 3);
  t[0][0] = -INFINITY;
  EXPECT_EQ(FirstNonFinite(t), 0);

  const int64_t world = 2;
  const std::vector<std::string> names = {"a", "b"};
  NonFiniteVerdict ok = CheckSavedTensors(Sum({PackSlots({0.0}, 0, world), PackSlots({0.0}, 1, world)}), world,
                                          {1, 1, 0, 4}, names);
  EXPECT_TRUE(ok.ok());
  NonFiniteVerdict bad = CheckSavedTensors(Sum({PackSlots({0.0}, 0, world), PackSlots({2.0}, 1, world)}), world,
                                           {1, 1, 0, 4}, names);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.rank, 1);
  EXPECT_THAT(Msg(bad), AllOf(HasSubstr("non-finite weights at the end of epoch 1/1 on rank 1: b has"),
                              HasSubstr("not written")));
}

}  // namespace
}  // namespace tpudist::train
