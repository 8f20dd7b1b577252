// Element types, reduction operators and the vectorizable reduction loops
// used by every algorithm that reduces: the shared-memory ones (ReduceInto
// over W peer slots) and the TCP ring (a ReduceFn folding a received segment
// into the local buffer, "reduce src into dst", see MakeReduceFn).
//
// The kernels reduce W input buffers element-wise into one output buffer in a
// fixed input order (input 0 first), so every rank that reduces the same
// inputs produces bit-identical results. Floating-point reductions of
// bfloat16 / float16 widen to fp32, combine all W inputs in fp32 and round to
// nearest-even once at the end. Integer SUM / PRODUCT wrap modulo 2^bits (as
// torch and Gloo do). AVG is SUM followed by one division by W (floating
// types only). This file is compiled with -O3; the hot fp32 loop is
// additionally cloned for AVX2 and picked at load time by the CPU; bf16 runs
// the hand-vectorized kernels of bf16_reduce.h (AVX-512 BF16 / AVX2 /
// portable, chosen once per process).
//
// Thread-safety: pure functions over caller-owned memory.
#ifndef TPU_DIST_COLLECTIVES_CORE_REDUCE_KERNELS_H_
#define TPU_DIST_COLLECTIVES_CORE_REDUCE_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "collectives/core/reduce_types.h"

namespace tpudist::collectives {

// Bytes per element of `type`.
size_t ElementSize(DataType type);
absl::string_view DataTypeName(DataType type);
absl::string_view ReduceKindName(ReduceKind kind);

// OK if `kind` is defined for `type` (AVG needs a floating type; the bitwise
// ops need an integer type); InvalidArgument otherwise.
absl::Status CheckReducible(DataType type, ReduceKind kind);

// out[i] = inputs[0][i] (op) inputs[1][i] (op) ... for i in [0, count).
// `out` may be one of the inputs (the same address: an in-place reduction,
// no copy); it must not partially overlap any input.
// REQUIRES: CheckReducible(type, kind).ok(); !inputs.empty(); every buffer
// holds `count` elements of `type`.
void ReduceInto(DataType type, ReduceKind kind, void* out,
                absl::Span<const void* const> inputs, int64_t count);

// The one "reduce src into dst" convention of this library:
// dst[i] = dst[i] (op) src[i] for i in [0, count), in place, bit-identical to
// ReduceInto(type, kind, out, {dst, src}, count). AVG folds as SUM here (the
// division by the number of contributions is the caller's: DivideInPlace).
// REQUIRES: as ReduceInto; dst and src do not overlap.
void ReduceInPlace(DataType type, ReduceKind kind, void* dst, const void* src,
                   int64_t count);

// Folds `count` elements at `src` into `dst` (dst = dst op src). The TCP ring
// algorithms take one; it must be associative and commutative for the result
// to be rank-independent.
using ReduceFn = std::function<void(void* dst, const void* src, size_t count)>;

// A ReduceFn running ReduceInPlace(type, kind, ...). Stateless: no scratch,
// no copy. REQUIRES: CheckReducible(type, kind).ok().
ReduceFn MakeReduceFn(DataType type, ReduceKind kind);

// data[i] = data[i] / divisor for `count` elements of a floating `type`,
// computed in double and rounded once to `type` (AVG after a SUM); a no-op
// for integer types (AVG is rejected for them by CheckReducible).
// REQUIRES: divisor > 0.
void DivideInPlace(DataType type, void* data, int64_t count, int64_t divisor);

// bfloat16 <-> fp32 helpers (round to nearest even; NaN stays NaN).
float BFloat16BitsToFloat(uint16_t bits);
uint16_t FloatToBFloat16Bits(float value);

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_CORE_REDUCE_KERNELS_H_
