// Reduction loops. Strategy: work in blocks of kBlock elements; keep a block
// accumulator in the widened type (fp32 for fp16, the type itself
// otherwise), fold each input into it with a simple contiguous loop that GCC
// auto-vectorizes at -O3, then narrow once into the output. bf16 has its own
// hand-vectorized kernels (bf16_reduce.h).
#include "collectives/core/reduce_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "collectives/core/bf16_reduce.h"
#include "c10/util/Half.h"

namespace tpudist::collectives {
namespace {

constexpr int64_t kBlock = 1024;

template <typename Acc>
inline Acc Combine(ReduceKind kind, Acc a, Acc b) {
  switch (kind) {
    case ReduceKind::kSum:
    case ReduceKind::kAvg:
      return a + b;
    case ReduceKind::kProduct:
      return a * b;
    case ReduceKind::kMin:
      return std::min(a, b);
    case ReduceKind::kMax:
      return std::max(a, b);
    default:
      if constexpr (std::is_integral_v<Acc>) {
        if (kind == ReduceKind::kBand) return a & b;
        if (kind == ReduceKind::kBor) return a | b;
        return a ^ b;
      }
      return a;
  }
}

// Folds `in` into `acc` for n elements; one instantiation per kind so the
// loop body is branch-free and vectorizable.
template <typename Acc, ReduceKind K>
inline void FoldLoop(Acc* __restrict acc, const Acc* __restrict in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] = Combine<Acc>(K, acc[i], in[i]);
}

template <typename Acc>
void Fold(ReduceKind kind, Acc* __restrict acc, const Acc* __restrict in,
          int64_t n) {
  switch (kind) {
    case ReduceKind::kSum:
    case ReduceKind::kAvg:
      return FoldLoop<Acc, ReduceKind::kSum>(acc, in, n);
    case ReduceKind::kProduct:
      return FoldLoop<Acc, ReduceKind::kProduct>(acc, in, n);
    case ReduceKind::kMin:
      return FoldLoop<Acc, ReduceKind::kMin>(acc, in, n);
    case ReduceKind::kMax:
      return FoldLoop<Acc, ReduceKind::kMax>(acc, in, n);
    case ReduceKind::kBand:
      return FoldLoop<Acc, ReduceKind::kBand>(acc, in, n);
    case ReduceKind::kBor:
      return FoldLoop<Acc, ReduceKind::kBor>(acc, in, n);
    case ReduceKind::kBxor:
      return FoldLoop<Acc, ReduceKind::kBxor>(acc, in, n);
  }
}

// Direct (unwidened) reduction for types whose accumulator is the element
// type itself. Signed integers accumulate in their unsigned twin for SUM /
// PRODUCT so that overflow wraps instead of being undefined.
template <typename T>
void ReduceSame(ReduceKind kind, void* out, absl::Span<const void* const> in,
                int64_t count, bool divide) {
  using U = std::conditional_t<std::is_integral_v<T> &&
                                   (sizeof(T) == 4 || sizeof(T) == 8),
                               std::make_unsigned_t<std::conditional_t<
                                   std::is_integral_v<T>, T, int>>,
                               T>;
  const bool wrap = std::is_integral_v<T> && !std::is_same_v<U, T> &&
                    (kind == ReduceKind::kSum || kind == ReduceKind::kProduct);
  // Blocked: the accumulator block stays in L1 while all W inputs are folded
  // in, so the output is written exactly once.
  alignas(64) T acc[kBlock];
  T* o = static_cast<T*>(out);
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t n = std::min(kBlock, count - b);
    std::memcpy(acc, static_cast<const T*>(in[0]) + b, n * sizeof(T));
    for (size_t k = 1; k < in.size(); ++k) {
      const T* src = static_cast<const T*>(in[k]) + b;
      if (wrap) {
        Fold<U>(kind, reinterpret_cast<U*>(acc), reinterpret_cast<const U*>(src), n);
      } else {
        Fold<T>(kind, acc, src, n);
      }
    }
    if constexpr (std::is_floating_point_v<T>) {
      if (divide) {
        const T w = static_cast<T>(in.size());
        for (int64_t i = 0; i < n; ++i) acc[i] /= w;
      }
    }
    std::memcpy(o + b, acc, n * sizeof(T));
  }
}

__attribute__((target_clones("avx2", "default"))) void ReduceFloat32(
    ReduceKind kind, void* out, absl::Span<const void* const> in,
    int64_t count, bool divide) {
  ReduceSame<float>(kind, out, in, count, divide);
}

void WidenHalf(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = static_cast<float>(c10::Half(src[i], c10::Half::from_bits()));
  }
}

void NarrowHalf(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = c10::Half(src[i]).x;
}

// fp16: widen each block of every input to fp32, fold, narrow once.
template <void (*Widen)(float*, const uint16_t*, int64_t),
          void (*Narrow)(uint16_t*, const float*, int64_t)>
void ReduceWidened(ReduceKind kind, void* out,
                   absl::Span<const void* const> in, int64_t count,
                   bool divide) {
  alignas(64) float acc[kBlock];
  alignas(64) float tmp[kBlock];
  uint16_t* o = static_cast<uint16_t*>(out);
  const float w = static_cast<float>(in.size());
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t n = std::min(kBlock, count - b);
    Widen(acc, static_cast<const uint16_t*>(in[0]) + b, n);
    for (size_t k = 1; k < in.size(); ++k) {
      Widen(tmp, static_cast<const uint16_t*>(in[k]) + b, n);
      Fold<float>(kind, acc, tmp, n);
    }
    if (divide) {
      for (int64_t i = 0; i < n; ++i) acc[i] /= w;
    }
    Narrow(o + b, acc, n);
  }
}

bool IsFloating(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat64 ||
         t == DataType::kBFloat16 || t == DataType::kFloat16;
}

}  // namespace

float BFloat16BitsToFloat(uint16_t bits) { return Bf16BitsToFloatInline(bits); }

uint16_t FloatToBFloat16Bits(float value) { return FloatToBf16BitsInline(value); }

size_t ElementSize(DataType type) {
  switch (type) {
    case DataType::kFloat32:
    case DataType::kInt32:
      return 4;
    case DataType::kFloat64:
    case DataType::kInt64:
      return 8;
    case DataType::kBFloat16:
    case DataType::kFloat16:
      return 2;
    case DataType::kInt16:
      return 2;
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
  }
  return 1;
}

absl::string_view DataTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat16: return "float16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kUInt8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kInt16: return "int16";
    case DataType::kBool: return "bool";
  }
  return "unknown";
}

absl::string_view ReduceKindName(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::kSum: return "SUM";
    case ReduceKind::kAvg: return "AVG";
    case ReduceKind::kProduct: return "PRODUCT";
    case ReduceKind::kMin: return "MIN";
    case ReduceKind::kMax: return "MAX";
    case ReduceKind::kBand: return "BAND";
    case ReduceKind::kBor: return "BOR";
    case ReduceKind::kBxor: return "BXOR";
  }
  return "unknown";
}

absl::Status CheckReducible(DataType type, ReduceKind kind) {
  const bool bitwise = kind == ReduceKind::kBand || kind == ReduceKind::kBor ||
                       kind == ReduceKind::kBxor;
  if (IsFloating(type) && bitwise) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce op ", ReduceKindName(kind),
                     " is not defined for ", DataTypeName(type)));
  }
  if (type == DataType::kBool && (kind == ReduceKind::kSum || kind == ReduceKind::kProduct)) {
    return absl::InvalidArgumentError(
        "bool reductions take BOR/BAND/MIN/MAX (the process group maps SUM and PRODUCT to them)");
  }
  if (!IsFloating(type) && kind == ReduceKind::kAvg) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce op AVG needs a floating dtype, got ", DataTypeName(type)));
  }
  return absl::OkStatus();
}

void ReduceInto(DataType type, ReduceKind kind, void* out,
                absl::Span<const void* const> inputs, int64_t count) {
  if (count <= 0) return;
  const bool divide = kind == ReduceKind::kAvg;
  switch (type) {
    case DataType::kFloat32:
      return ReduceFloat32(kind, out, inputs, count, divide);
    case DataType::kFloat64:
      return ReduceSame<double>(kind, out, inputs, count, divide);
    case DataType::kInt32:
      return ReduceSame<int32_t>(kind, out, inputs, count, false);
    case DataType::kInt64:
      return ReduceSame<int64_t>(kind, out, inputs, count, false);
    case DataType::kUInt8:
    case DataType::kBool:  // 0/1 bytes: BOR/BAND/MIN/MAX keep them 0/1
      return ReduceSame<uint8_t>(kind, out, inputs, count, false);
    case DataType::kInt8:
      return ReduceSame<int8_t>(kind, out, inputs, count, false);
    case DataType::kInt16:
      return ReduceSame<int16_t>(kind, out, inputs, count, false);
    case DataType::kBFloat16:
      // Convert-accumulate-convert, vectorized by hand (bf16_reduce.h).
      return ReduceBf16(DefaultBf16Path(), kind, out, inputs, count);
    case DataType::kFloat16:
      return ReduceWidened<WidenHalf, NarrowHalf>(kind, out, inputs, count,
                                                  divide);
  }
}

void ReduceInPlace(DataType type, ReduceKind kind, void* dst, const void* src,
                   int64_t count) {
  // Every kernel reads a block of all inputs into its accumulator before it
  // writes that block of the output, so out == inputs[0] is safe.
  const void* ins[2] = {dst, src};
  ReduceInto(type, kind == ReduceKind::kAvg ? ReduceKind::kSum : kind, dst, ins,
             count);
}

ReduceFn MakeReduceFn(DataType type, ReduceKind kind) {
  return [type, kind](void* dst, const void* src, size_t count) {
    ReduceInPlace(type, kind, dst, src, static_cast<int64_t>(count));
  };
}

void DivideInPlace(DataType type, void* data, int64_t count, int64_t divisor) {
  const double d = static_cast<double>(divisor);
  switch (type) {
    case DataType::kFloat32: {
      auto* p = static_cast<float*>(data);
      for (int64_t i = 0; i < count; ++i) p[i] = static_cast<float>(p[i] / d);
      break;
    }
    case DataType::kFloat64: {
      auto* p = static_cast<double*>(data);
      for (int64_t i = 0; i < count; ++i) p[i] /= d;
      break;
    }
    case DataType::kBFloat16: {
      auto* p = static_cast<uint16_t*>(data);
      for (int64_t i = 0; i < count; ++i) {
        p[i] = FloatToBFloat16Bits(static_cast<float>(BFloat16BitsToFloat(p[i]) / d));
      }
      break;
    }
    case DataType::kFloat16: {
      auto* p = static_cast<c10::Half*>(data);
      for (int64_t i = 0; i < count; ++i) {
        p[i] = c10::Half(static_cast<float>(static_cast<float>(p[i]) / d));
      }
      break;
    }
    default:
      break;  // AVG is rejected for integers before any op runs
  }
}

}  // namespace tpudist::collectives
