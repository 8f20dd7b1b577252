// Element types, reduction operators and the vectorizable reduction loops
// used by every shared-memory algorithm.
//
// The kernels reduce W input buffers element-wise into one output buffer in a
// fixed input order (input 0 first), so every rank that reduces the same
// inputs produces bit-identical results. Floating-point reductions of
// bfloat16 / float16 widen to fp32, combine all W inputs in fp32 and round to
// nearest-even once at the end. Integer SUM / PRODUCT wrap modulo 2^bits (as
// torch and Gloo do). AVG is SUM followed by one division by W (floating
// types only). This file is compiled with -O3; the hot fp32 / bf16 loops are
// additionally cloned for AVX2 and picked at load time by the CPU.
//
// Thread-safety: pure functions over caller-owned memory.
#ifndef TPU_DIST_COLLECTIVES_SHM_REDUCE_KERNELS_H_
#define TPU_DIST_COLLECTIVES_SHM_REDUCE_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tpudist::collectives::shm {

enum class DataType : uint8_t {
  kFloat32 = 1,
  kFloat64,
  kBFloat16,
  kFloat16,
  kInt32,
  kInt64,
  kUInt8,
  kInt8,
  kInt16,
  kBool,  // one byte, 0 or 1; SUM/PRODUCT arrive here as BOR/BAND
};

enum class ReduceKind : uint8_t {
  kSum = 1,
  kAvg,
  kProduct,
  kMin,
  kMax,
  kBand,
  kBor,
  kBxor,
};

// Bytes per element of `type`.
size_t ElementSize(DataType type);
absl::string_view DataTypeName(DataType type);
absl::string_view ReduceKindName(ReduceKind kind);

// OK if `kind` is defined for `type` (AVG needs a floating type; the bitwise
// ops need an integer type); InvalidArgument otherwise.
absl::Status CheckReducible(DataType type, ReduceKind kind);

// out[i] = inputs[0][i] (op) inputs[1][i] (op) ... for i in [0, count).
// REQUIRES: CheckReducible(type, kind).ok(); !inputs.empty(); every buffer
// holds `count` elements of `type`; `out` does not overlap any input.
void ReduceInto(DataType type, ReduceKind kind, void* out,
                absl::Span<const void* const> inputs, int64_t count);

// bfloat16 <-> fp32 helpers (round to nearest even; NaN stays NaN).
float BFloat16BitsToFloat(uint16_t bits);
uint16_t FloatToBFloat16Bits(float value);

}  // namespace tpudist::collectives::shm

#endif  // TPU_DIST_COLLECTIVES_SHM_REDUCE_KERNELS_H_
