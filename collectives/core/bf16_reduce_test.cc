// Every bf16 path this CPU runs, forced one at a time, against torch's bf16
// arithmetic (the oracle) bit for bit, on data full of NaN, +-inf,
// denormals, -0 and the largest finite values, at odd lengths and unaligned
// addresses; and the run-time choice of path as a pure function.
#include "collectives/core/bf16_reduce.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "collectives/core/reduce_kernels.h"
#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

// bf16 bit patterns: mostly N(0, 4^2) values, one in four a special value.
std::vector<uint16_t> RandomBf16(int64_t n, uint32_t seed, bool with_nan) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<uint16_t> nans = {0x7fc0, 0xffc0, 0x7f81, 0xffff};
  std::vector<uint16_t> other = {0x7f80, 0xff80, 0x8000, 0x0000, 0x7f7f, 0xff7f, 0x0080, 0x8080};
  std::vector<uint16_t> v(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t r = rng();
    if (r % 4 != 0) {
      v[i] = c10::BFloat16(normal(rng)).x;
    } else if (r % 16 == 4) {  // denormal, either sign
      v[i] = static_cast<uint16_t>(((r >> 8) % 0x7f + 1) | (r & 0x100 ? 0x8000 : 0));
    } else if (r % 16 == 8 && with_nan) {
      v[i] = nans[(r >> 8) % nans.size()];
    } else {
      v[i] = other[(r >> 8) % other.size()];
    }
  }
  return v;
}

// A bf16 tensor [n] holding `bits`.
at::Tensor ToTensor(const std::vector<uint16_t>& bits) {
  const auto n = static_cast<int64_t>(bits.size());
  return at::from_blob(const_cast<uint16_t*>(bits.data()), {n}, at::kBFloat16).clone();
}

// Number of elements where `got` differs from the bf16 tensor `want` [n]:
// bit for bit, except that any NaN matches any NaN (torch's vectorized and
// scalar conversions write different NaN patterns). Prints the first three.
int64_t Mismatches(const uint16_t* got, const at::Tensor& want, const std::string& what) {
  const auto* w = static_cast<const uint16_t*>(want.data_ptr());
  int64_t bad = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const bool both_nan = std::isnan(Bf16BitsToFloatInline(got[i])) &&
                          std::isnan(Bf16BitsToFloatInline(w[i]));
    if (got[i] != w[i] && !both_nan && ++bad <= 3) {
      ADD_FAILURE() << what << " element " << i << ": got 0x" << std::hex << got[i]
                    << " want 0x" << w[i];
    }
  }
  return bad;
}

// A buffer of n bf16 values starting 2 bytes past a 64-byte boundary.
struct Unaligned {
  explicit Unaligned(const std::vector<uint16_t>& bits) : storage(bits.size() + 33) {
    std::memcpy(data(), bits.data(), bits.size() * 2);
  }
  uint16_t* data() {
    auto a = reinterpret_cast<uintptr_t>(storage.data());
    return reinterpret_cast<uint16_t*>(((a + 63) & ~uintptr_t{63}) + 2);
  }
  std::vector<uint16_t> storage;
};

class Bf16PathTest : public ::testing::TestWithParam<Bf16Path> {
 protected:
  void SetUp() override {
    if (!Bf16PathRunnable(GetParam(), DetectCpuFeatures())) {
      GTEST_SKIP() << Bf16PathName(GetParam()) << " cannot execute on this CPU (not run)";
    }
  }
};

const int64_t kCounts[] = {0, 1, 7, 15, 16, 17, 31, 33, 1000003};

TEST_P(Bf16PathTest, TwoInputsMatchTorchBitForBit) {
  for (int64_t n : kCounts) {
    const std::vector<uint16_t> a = RandomBf16(n, 1 + n, true), b = RandomBf16(n, 2 + n, true);
    const at::Tensor ta = ToTensor(a), tb = ToTensor(b);
    for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kProduct, ReduceKind::kAvg}) {
      Unaligned ua(a), ub(b), out(std::vector<uint16_t>(n, 0x1234));
      const void* ins[2] = {ua.data(), ub.data()};
      ReduceBf16(GetParam(), kind, out.data(), ins, n);
      const at::Tensor avg = ((ta.to(at::kFloat) + tb.to(at::kFloat)) / 2).to(at::kBFloat16);
      const at::Tensor want = kind == ReduceKind::kSum       ? ta + tb
                              : kind == ReduceKind::kProduct ? ta * tb
                                                             : avg;
      const std::string what = std::string(ReduceKindName(kind)) + " n=" + std::to_string(n);
      EXPECT_EQ(Mismatches(out.data(), want, what), 0);
    }
    // In place, as the TCP ring folds a received segment: dst = dst + src.
    Unaligned dst(a), src(b);
    const void* ins[2] = {dst.data(), src.data()};
    ReduceBf16(GetParam(), ReduceKind::kSum, dst.data(), ins, n);
    EXPECT_EQ(Mismatches(dst.data(), ta + tb, "in-place SUM n=" + std::to_string(n)), 0);
  }
}

TEST_P(Bf16PathTest, ManyInputsAccumulateInFp32AndRoundOnce) {
  for (int world : {3, 5}) {
    for (int64_t n : kCounts) {
      std::vector<Unaligned> bufs;
      std::vector<const void*> ins;
      bufs.reserve(world);
      at::Tensor acc = at::zeros({n}, at::kFloat);
      for (int r = 0; r < world; ++r) {
        const std::vector<uint16_t> v = RandomBf16(n, 100 * world + r + n, true);
        bufs.emplace_back(v);
        ins.push_back(bufs.back().data());
        acc = r == 0 ? ToTensor(v).to(at::kFloat) : acc + ToTensor(v).to(at::kFloat);
      }
      Unaligned out(std::vector<uint16_t>(n, 0));
      ReduceBf16(GetParam(), ReduceKind::kSum, out.data(), ins, n);
      EXPECT_EQ(Mismatches(out.data(), acc.to(at::kBFloat16),
                           "SUM world=" + std::to_string(world) + " n=" + std::to_string(n)), 0);
      ReduceBf16(GetParam(), ReduceKind::kAvg, out.data(), ins, n);
      EXPECT_EQ(Mismatches(out.data(), (acc / world).to(at::kBFloat16),
                           "AVG world=" + std::to_string(world) + " n=" + std::to_string(n)), 0);
    }
  }
}

// MIN / MAX: torch's at::minimum / at::maximum agree with std::min / std::max
// on NaN-free data up to the sign of equal zeros; with NaN the semantics
// differ by design (bf16_reduce.h), so there the portable path is the oracle.
TEST_P(Bf16PathTest, MinMaxMatchTorchWithoutNaNAndPortableWithIt) {
  for (int64_t n : kCounts) {
    for (bool with_nan : {false, true}) {
      const std::vector<uint16_t> a = RandomBf16(n, 7 + n, with_nan);
      const std::vector<uint16_t> b = RandomBf16(n, 8 + n, with_nan);
      const at::Tensor ta = ToTensor(a), tb = ToTensor(b);
      for (ReduceKind kind : {ReduceKind::kMin, ReduceKind::kMax}) {
        Unaligned ua(a), ub(b);
        Unaligned out(std::vector<uint16_t>(n, 0)), ref(std::vector<uint16_t>(n, 0));
        const void* ins[2] = {ua.data(), ub.data()};
        ReduceBf16(GetParam(), kind, out.data(), ins, n);
        ReduceBf16(Bf16Path::kPortable, kind, ref.data(), ins, n);
        EXPECT_EQ(std::memcmp(out.data(), ref.data(), n * 2), 0)
            << ReduceKindName(kind) << " n=" << n;
        if (with_nan) continue;
        const at::Tensor want =
            kind == ReduceKind::kMin ? at::minimum(ta, tb) : at::maximum(ta, tb);
        const at::Tensor got = ToTensor(std::vector<uint16_t>(out.data(), out.data() + n));
        // Value equality (+0 == -0), not bits.
        EXPECT_TRUE(at::eq(got.to(at::kFloat), want.to(at::kFloat)).all().item<bool>())
            << ReduceKindName(kind) << " n=" << n;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, Bf16PathTest,
                         ::testing::Values(Bf16Path::kPortable, Bf16Path::kAvx2,
                                           Bf16Path::kAvx512Bf16),
                         [](const auto& info) { return std::string(Bf16PathName(info.param)); });

TEST(Bf16DispatchTest, ChoosesTheFastestRunnablePath) {
  CpuFeatures none;
  EXPECT_EQ(ChooseBf16Path(none), Bf16Path::kPortable);
  auto features = [](bool avx2, bool avx512f, bool avx512bf16) {
    CpuFeatures f;
    f.avx2 = avx2;
    f.avx512f = avx512f;
    f.avx512bf16 = avx512bf16;
    return f;
  };
  const CpuFeatures avx2 = features(true, false, false);
  const CpuFeatures avx512_no_bf16 = features(true, true, false);
  const CpuFeatures bf16_no_f = features(true, false, true);
  const CpuFeatures all = features(true, true, true);
  EXPECT_TRUE(Bf16PathRunnable(Bf16Path::kPortable, none));
  EXPECT_FALSE(Bf16PathRunnable(Bf16Path::kAvx2, none));
  EXPECT_FALSE(Bf16PathRunnable(Bf16Path::kAvx512Bf16, bf16_no_f));
#if defined(__x86_64__)
  EXPECT_EQ(ChooseBf16Path(avx2), Bf16Path::kAvx2);
  EXPECT_EQ(ChooseBf16Path(avx512_no_bf16), Bf16Path::kAvx2);
  EXPECT_EQ(ChooseBf16Path(bf16_no_f), Bf16Path::kAvx2);
  EXPECT_EQ(ChooseBf16Path(all), Bf16Path::kAvx512Bf16);
#else
  EXPECT_EQ(ChooseBf16Path(all), Bf16Path::kPortable);
#endif
  const CpuFeatures here = DetectCpuFeatures();
  EXPECT_EQ(DefaultBf16Path(), ChooseBf16Path(here));
  EXPECT_TRUE(Bf16PathRunnable(DefaultBf16Path(), here));
  std::printf("this CPU: avx2=%d avx512f=%d avx512bf16=%d -> %s\n", here.avx2, here.avx512f,
              here.avx512bf16, std::string(Bf16PathName(DefaultBf16Path())).c_str());
}

}  // namespace
}  // namespace tpudist::collectives
