// bf16 kernels. Each vector path handles the largest multiple of its step
// and leaves the remaining < step elements to the portable loop, so all
// paths share one tail (and one definition of the rounding).
#include "collectives/core/bf16_reduce.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tpudist::collectives {
namespace {

constexpr int64_t kBlock = 1024;

template <ReduceKind K>
inline float CombineScalar(float acc, float x) {
  if constexpr (K == ReduceKind::kSum) return acc + x;
  if constexpr (K == ReduceKind::kProduct) return acc * x;
  if constexpr (K == ReduceKind::kMin) return std::min(acc, x);
  return std::max(acc, x);
}

inline const uint16_t* In(absl::Span<const void* const> in, size_t k) {
  return static_cast<const uint16_t*>(in[k]);
}

// Elements [begin, end): blocked, the fp32 accumulator block stays in L1.
template <ReduceKind K>
void PortableRange(uint16_t* out, absl::Span<const void* const> in,
                   int64_t begin, int64_t end, bool divide) {
  alignas(64) float acc[kBlock];
  const float w = static_cast<float>(in.size());
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t n = std::min(kBlock, end - b);
    const uint16_t* src0 = In(in, 0) + b;
    for (int64_t i = 0; i < n; ++i) acc[i] = Bf16BitsToFloatInline(src0[i]);
    for (size_t k = 1; k < in.size(); ++k) {
      const uint16_t* src = In(in, k) + b;
      for (int64_t i = 0; i < n; ++i) {
        acc[i] = CombineScalar<K>(acc[i], Bf16BitsToFloatInline(src[i]));
      }
    }
    if (divide) {
      for (int64_t i = 0; i < n; ++i) acc[i] /= w;
    }
    for (int64_t i = 0; i < n; ++i) out[b + i] = FloatToBf16BitsInline(acc[i]);
  }
}

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2")

// Operand order mirrors std::min(acc, x) = (x < acc ? x : acc) and
// std::max(acc, x) = (acc < x ? x : acc): MINPS/MAXPS return their second
// operand when the comparison is false (NaN included).
template <ReduceKind K>
inline __m256 Combine8(__m256 acc, __m256 x) {
  if constexpr (K == ReduceKind::kSum) return _mm256_add_ps(acc, x);
  if constexpr (K == ReduceKind::kProduct) return _mm256_mul_ps(acc, x);
  if constexpr (K == ReduceKind::kMin) return _mm256_min_ps(x, acc);
  return _mm256_max_ps(x, acc);
}

// 16 bf16 -> 2 x 8 fp32, zero low halves interleaved in by unpack (one op
// per 8 elements). The lanes come out in unpack order: lo = elements
// [0..3, 8..11], hi = [4..7, 12..15]; every input is widened alike, so the
// element-wise combine does not care, and Avx2Range's packus (also per
// 128-bit lane) puts them back in order.
inline void Widen16(const uint16_t* p, __m256* lo, __m256* hi) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i zero = _mm256_setzero_si256();
  *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
  *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
}

// 8 fp32 -> 8 bf16 bit patterns in the low halves of the 32-bit lanes.
inline __m256i Round8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(nan));
}

template <ReduceKind K>
void Avx2Range(uint16_t* out, absl::Span<const void* const> in, int64_t end,
               bool divide) {
  const __m256 w = _mm256_set1_ps(static_cast<float>(in.size()));
  for (int64_t i = 0; i < end; i += 16) {
    __m256 lo, hi, x_lo, x_hi;
    Widen16(In(in, 0) + i, &lo, &hi);
    for (size_t k = 1; k < in.size(); ++k) {
      Widen16(In(in, k) + i, &x_lo, &x_hi);
      lo = Combine8<K>(lo, x_lo);
      hi = Combine8<K>(hi, x_hi);
    }
    if (divide) {
      lo = _mm256_div_ps(lo, w);
      hi = _mm256_div_ps(hi, w);
    }
    // Narrow: per 128-bit lane, packus takes lo's 4 then hi's 4 elements,
    // which undoes Widen16's order.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_packus_epi32(Round8(lo), Round8(hi)));
  }
}

#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bf16")
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own
// _mm512_undefined_epi32() pass-through operands.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

template <ReduceKind K>
inline __m512 Combine16(__m512 acc, __m512 x) {
  if constexpr (K == ReduceKind::kSum) return _mm512_add_ps(acc, x);
  if constexpr (K == ReduceKind::kProduct) return _mm512_mul_ps(acc, x);
  if constexpr (K == ReduceKind::kMin) return _mm512_min_ps(x, acc);
  return _mm512_max_ps(x, acc);
}

inline __m512 Widen16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Lanes VCVTNE2PS2BF16 gets "wrong" for us: NaN (payload kept instead of
// 0x7fc0) and nonzero denormals (flushed to zero instead of rounded).
inline __mmask16 Special16(__m512 v) {
  const __m512i abs = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmp_epu32_mask(abs, _mm512_set1_epi32(0x7f800000), _MM_CMPINT_NLE);
  const __mmask16 denormal = _mm512_cmp_epu32_mask(
      _mm512_sub_epi32(abs, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x007fffff), _MM_CMPINT_LT);
  return nan | denormal;
}

// The integer round-to-nearest-even of Round8, 16 lanes, narrowed to 16 x u16.
inline __m256i Round16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(r);
}

template <ReduceKind K>
void Avx512Bf16Range(uint16_t* out, absl::Span<const void* const> in,
                     int64_t end, bool divide) {
  const __m512 w = _mm512_set1_ps(static_cast<float>(in.size()));
  for (int64_t i = 0; i < end; i += 32) {
    __m512 lo = Widen16(In(in, 0) + i);
    __m512 hi = Widen16(In(in, 0) + i + 16);
    for (size_t k = 1; k < in.size(); ++k) {
      lo = Combine16<K>(lo, Widen16(In(in, k) + i));
      hi = Combine16<K>(hi, Widen16(In(in, k) + i + 16));
    }
    if (divide) {
      lo = _mm512_div_ps(lo, w);
      hi = _mm512_div_ps(hi, w);
    }
    if ((Special16(lo) | Special16(hi)) == 0) {
      // Lower 16 results from the second operand, upper 16 from the first.
      // (GCC vector cast: same 64 bytes, bf16 -> integer lanes.)
      const __m512i b = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      _mm512_storeu_si512(out + i, b);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), Round16(lo));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 16), Round16(hi));
    }
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif  // __x86_64__

template <ReduceKind K>
void ReduceWithPath(Bf16Path path, uint16_t* out, absl::Span<const void* const> in,
                 int64_t count, bool divide) {
  int64_t done = 0;
#if defined(__x86_64__)
  if (path == Bf16Path::kAvx2) {
    done = count - count % 16;
    Avx2Range<K>(out, in, done, divide);
  } else if (path == Bf16Path::kAvx512Bf16) {
    done = count - count % 32;
    Avx512Bf16Range<K>(out, in, done, divide);
  }
#endif
  PortableRange<K>(out, in, done, count, divide);
}

}  // namespace

absl::string_view Bf16PathName(Bf16Path path) {
  switch (path) {
    case Bf16Path::kPortable: return "portable";
    case Bf16Path::kAvx2: return "avx2";
    case Bf16Path::kAvx512Bf16: return "avx512bf16";
  }
  return "unknown";
}

CpuFeatures DetectCpuFeatures() {
  CpuFeatures f;
#if defined(__x86_64__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
#endif
  return f;
}

bool Bf16PathRunnable(Bf16Path path, const CpuFeatures& cpu) {
  switch (path) {
    case Bf16Path::kPortable:
      return true;
#if defined(__x86_64__)
    case Bf16Path::kAvx2:
      return cpu.avx2;
    case Bf16Path::kAvx512Bf16:
      return cpu.avx512f && cpu.avx512bf16;
#endif
    default:
      return false;
  }
}

Bf16Path ChooseBf16Path(const CpuFeatures& cpu) {
  for (Bf16Path p : {Bf16Path::kAvx512Bf16, Bf16Path::kAvx2}) {
    if (Bf16PathRunnable(p, cpu)) return p;
  }
  return Bf16Path::kPortable;
}

Bf16Path DefaultBf16Path() {
  static const Bf16Path path = ChooseBf16Path(DetectCpuFeatures());
  return path;
}

void ReduceBf16(Bf16Path path, ReduceKind kind, void* out,
                absl::Span<const void* const> inputs, int64_t count) {
  if (count <= 0) return;
  auto* o = static_cast<uint16_t*>(out);
  switch (kind) {
    case ReduceKind::kSum:
      return ReduceWithPath<ReduceKind::kSum>(path, o, inputs, count, false);
    case ReduceKind::kAvg:
      return ReduceWithPath<ReduceKind::kSum>(path, o, inputs, count, true);
    case ReduceKind::kProduct:
      return ReduceWithPath<ReduceKind::kProduct>(path, o, inputs, count, false);
    case ReduceKind::kMin:
      return ReduceWithPath<ReduceKind::kMin>(path, o, inputs, count, false);
    case ReduceKind::kMax:
      return ReduceWithPath<ReduceKind::kMax>(path, o, inputs, count, false);
    default:
      return;  // bitwise kinds: rejected by CheckReducible before any op runs
  }
}

}  // namespace tpudist::collectives
