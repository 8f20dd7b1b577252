// Unit tests of the reduction kernels, against double-precision / torch
// oracles, and of the in-place ("reduce src into dst") convention.
#include "collectives/core/reduce_kernels.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

std::vector<const void*> Ptrs(const std::vector<at::Tensor>& ts) {
  std::vector<const void*> v;
  for (const auto& t : ts) v.push_back(t.data_ptr());
  return v;
}

TEST(ReduceKernelsTest, BFloat16RoundingMatchesC10) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor x = at::randn({100000}, gen) * 1000;
  const float* p = x.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(FloatToBFloat16Bits(p[i]), c10::BFloat16(p[i]).x) << p[i];
    ASSERT_EQ(BFloat16BitsToFloat(c10::BFloat16(p[i]).x), float(c10::BFloat16(p[i])));
  }
  EXPECT_TRUE(std::isnan(BFloat16BitsToFloat(FloatToBFloat16Bits(NAN))));
}

TEST(ReduceKernelsTest, BFloat16ReductionSpecialValuesMatchC10) {
  // The vectorized narrowing of a bf16 sum must round exactly like
  // c10::BFloat16: exact ties go to even (1 + 2^-8 -> 1, 1.0078125 + 2^-8 ->
  // 1.015625), sums past the largest bf16 become Inf, NaN stays NaN.
  std::vector<float> a = {1.0f, 1.0078125f, -1.0f, 3.3895e38f, INFINITY, NAN, 0.5f, -0.0f};
  std::vector<float> b = {0.00390625f, 0.00390625f, -0.00390625f, 3.3895e38f, 1.0f, 1.0f,
                          0.001953125f, -0.0f};
  at::Tensor ta = at::tensor(a).to(at::kBFloat16);
  at::Tensor tb = at::tensor(b).to(at::kBFloat16);
  at::Tensor out = at::empty_like(ta);
  std::vector<at::Tensor> ins = {ta, tb};
  ReduceInto(DataType::kBFloat16, ReduceKind::kSum, out.data_ptr(), Ptrs(ins), ta.numel());
  at::Tensor expect = (ta.to(at::kFloat) + tb.to(at::kFloat)).to(at::kBFloat16);
  EXPECT_EQ(out[0].item<float>(), 1.0f);
  EXPECT_EQ(out[1].item<float>(), 1.015625f);
  for (int64_t i = 0; i < ta.numel(); ++i) {
    const float e = expect[i].item<float>();
    const float g = out[i].item<float>();
    if (std::isnan(e)) {
      EXPECT_TRUE(std::isnan(g)) << i;
    } else {
      EXPECT_EQ(g, e) << "element " << i;
    }
  }
}

TEST(ReduceKernelsTest, BFloat16SumAccumulatesInFp32AndRoundsOnce) {
  // 16 inputs whose bf16-by-bf16 sum loses precision; the one-rounding
  // result must equal round(fp32 sum), and differ from naive bf16 adds.
  const int world = 16;
  const int64_t n = 3001;  // > one 1024-element block, not a multiple
  std::vector<at::Tensor> ins;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  for (int r = 0; r < world; ++r) ins.push_back(at::randn({n}, gen).to(at::kBFloat16));
  at::Tensor out = at::empty({n}, at::kBFloat16);
  ReduceInto(DataType::kBFloat16, ReduceKind::kSum, out.data_ptr(), Ptrs(ins), n);
  at::Tensor acc = ins[0].to(at::kFloat);
  at::Tensor naive = ins[0].clone();
  for (int r = 1; r < world; ++r) {
    acc = acc + ins[r].to(at::kFloat);
    naive = naive + ins[r];
  }
  EXPECT_TRUE(at::equal(out, acc.to(at::kBFloat16)));
  EXPECT_FALSE(at::equal(out, naive)) << "test inputs too benign";
  // AVG divides the fp32 sum once, before rounding.
  ReduceInto(DataType::kBFloat16, ReduceKind::kAvg, out.data_ptr(), Ptrs(ins), n);
  EXPECT_TRUE(at::equal(out, (acc / world).to(at::kBFloat16)));
}

TEST(ReduceKernelsTest, FloatTypesMatchTorchInRankOrder) {
  for (at::ScalarType type : {at::kFloat, at::kDouble, at::kHalf}) {
    std::vector<at::Tensor> ins;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
    for (int r = 0; r < 5; ++r) ins.push_back(at::randn({1037}, gen).to(type));
    const bool half = type == at::kHalf;
    for (auto [kind, name] : {std::pair{ReduceKind::kSum, "sum"},
                              std::pair{ReduceKind::kMax, "max"},
                              std::pair{ReduceKind::kMin, "min"},
                              std::pair{ReduceKind::kProduct, "prod"}}) {
      at::Tensor out = at::empty({1037}, type);
      const DataType dt = type == at::kFloat    ? DataType::kFloat32
                          : type == at::kDouble ? DataType::kFloat64
                                                : DataType::kFloat16;
      ReduceInto(dt, kind, out.data_ptr(), Ptrs(ins), 1037);
      at::Tensor acc = half ? ins[0].to(at::kFloat) : ins[0].clone();
      for (int r = 1; r < 5; ++r) {
        at::Tensor x = half ? ins[r].to(at::kFloat) : ins[r];
        if (kind == ReduceKind::kSum) acc = acc + x;
        if (kind == ReduceKind::kMax) acc = at::maximum(acc, x);
        if (kind == ReduceKind::kMin) acc = at::minimum(acc, x);
        if (kind == ReduceKind::kProduct) acc = acc * x;
      }
      EXPECT_TRUE(at::equal(out, acc.to(type))) << c10::toString(type) << " " << name;
    }
  }
}

TEST(ReduceKernelsTest, IntegersWrapAndBitwiseOps) {
  std::vector<int32_t> a = {INT32_MAX, -7, 12}, b = {1, 3, 10};
  int32_t out[3];
  const std::vector<const void*> in = {a.data(), b.data()};
  ReduceInto(DataType::kInt32, ReduceKind::kSum, out, in, 3);
  EXPECT_THAT(out, ::testing::ElementsAre(INT32_MIN, -4, 22));
  ReduceInto(DataType::kInt32, ReduceKind::kBand, out, in, 3);
  EXPECT_THAT(out, ::testing::ElementsAre(1, -7 & 3, 12 & 10));
  ReduceInto(DataType::kInt32, ReduceKind::kBxor, out, in, 3);
  EXPECT_THAT(out, ::testing::ElementsAre(INT32_MAX ^ 1, -7 ^ 3, 12 ^ 10));
  std::vector<uint8_t> c = {250, 3}, d = {10, 4};
  uint8_t o8[2];
  ReduceInto(DataType::kUInt8, ReduceKind::kSum, o8, {c.data(), d.data()}, 2);
  EXPECT_THAT(o8, ::testing::ElementsAre(4, 7));
  ReduceInto(DataType::kUInt8, ReduceKind::kProduct, o8, {c.data(), d.data()}, 2);
  EXPECT_THAT(o8, ::testing::ElementsAre(uint8_t(2500 % 256), 12));
  std::vector<int64_t> e = {INT64_MIN, 5}, f = {-1, 6};
  int64_t o64[2];
  ReduceInto(DataType::kInt64, ReduceKind::kMin, o64, {e.data(), f.data()}, 2);
  EXPECT_THAT(o64, ::testing::ElementsAre(INT64_MIN, 5));
}

TEST(ReduceKernelsTest, CheckReducible) {
  EXPECT_TRUE(CheckReducible(DataType::kFloat32, ReduceKind::kAvg).ok());
  EXPECT_FALSE(CheckReducible(DataType::kInt32, ReduceKind::kAvg).ok());
  EXPECT_FALSE(CheckReducible(DataType::kBFloat16, ReduceKind::kBor).ok());
  EXPECT_TRUE(CheckReducible(DataType::kUInt8, ReduceKind::kBor).ok());
  EXPECT_EQ(ElementSize(DataType::kBFloat16), 2u);
  EXPECT_EQ(ElementSize(DataType::kInt64), 8u);
}

// The "reduce src into dst" convention (ReduceInPlace / MakeReduceFn, used by
// the TCP ring) must give the same bits as the out-of-place two-input
// ReduceInto the shared-memory algorithms run, across kernel block
// boundaries (3001 elements > 2 blocks) and for every dtype.
TEST(ReduceKernelsTest, InPlaceMatchesOutOfPlaceBitwise) {
  const int64_t n = 3001;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  for (auto [type, dt] : {std::pair{at::kFloat, DataType::kFloat32},
                          std::pair{at::kDouble, DataType::kFloat64},
                          std::pair{at::kBFloat16, DataType::kBFloat16},
                          std::pair{at::kHalf, DataType::kFloat16},
                          std::pair{at::kInt, DataType::kInt32},
                          std::pair{at::kLong, DataType::kInt64},
                          std::pair{at::kByte, DataType::kUInt8},
                          std::pair{at::kChar, DataType::kInt8},
                          std::pair{at::kShort, DataType::kInt16}}) {
    const bool floating = at::isFloatingType(type);
    at::Tensor a = floating ? at::randn({n}, gen).to(type)
                            : at::randint(-100, 100, {n}, gen).to(type);
    at::Tensor b = floating ? at::randn({n}, gen).to(type)
                            : at::randint(-100, 100, {n}, gen).to(type);
    for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kProduct, ReduceKind::kMin,
                            ReduceKind::kMax, ReduceKind::kBxor}) {
      if (!CheckReducible(dt, kind).ok()) continue;
      at::Tensor expected = at::empty({n}, type);
      ReduceInto(dt, kind, expected.data_ptr(), Ptrs({a, b}), n);
      at::Tensor dst = a.clone();
      ReduceInPlace(dt, kind, dst.data_ptr(), b.data_ptr(), n);
      EXPECT_EQ(std::memcmp(dst.data_ptr(), expected.data_ptr(), n * ElementSize(dt)), 0)
          << c10::toString(type) << " " << ReduceKindName(kind);
      at::Tensor via_fn = a.clone();
      MakeReduceFn(dt, kind)(via_fn.data_ptr(), b.data_ptr(), static_cast<size_t>(n));
      EXPECT_EQ(std::memcmp(via_fn.data_ptr(), expected.data_ptr(), n * ElementSize(dt)), 0)
          << c10::toString(type) << " " << ReduceKindName(kind);
    }
  }
}

TEST(ReduceKernelsTest, ReduceInPlaceFoldsAvgAsSum) {
  std::vector<float> dst = {1, 2, 3}, src = {4, 5, 6};
  ReduceInPlace(DataType::kFloat32, ReduceKind::kAvg, dst.data(), src.data(), 3);
  EXPECT_THAT(dst, testing::ElementsAre(5, 7, 9));
}

TEST(ReduceKernelsTest, DivideInPlaceMatchesTorchDivision) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  for (auto [type, dt] : {std::pair{at::kFloat, DataType::kFloat32},
                          std::pair{at::kDouble, DataType::kFloat64},
                          std::pair{at::kBFloat16, DataType::kBFloat16},
                          std::pair{at::kHalf, DataType::kFloat16}}) {
    at::Tensor x = (at::randn({777}, gen) * 100).to(type);
    // Oracle: divide in double, round once to the element type.
    at::Tensor expected = (x.to(at::kDouble) / 6).to(type);
    at::Tensor got = x.clone();
    DivideInPlace(dt, got.data_ptr(), got.numel(), 6);
    if (type == at::kBFloat16 || type == at::kHalf) {
      // The kernel divides the fp32 value in double and rounds once; from a
      // 16-bit input that equals torch's fp32 division rounded to the type.
      expected = (x.to(at::kFloat) / 6).to(type);
    }
    EXPECT_TRUE(at::equal(got, expected)) << c10::toString(type);
  }
  std::vector<int32_t> ints = {6, 12};
  DivideInPlace(DataType::kInt32, ints.data(), 2, 6);  // integers: no-op
  EXPECT_THAT(ints, testing::ElementsAre(6, 12));
}

}  // namespace
}  // namespace tpudist::collectives
