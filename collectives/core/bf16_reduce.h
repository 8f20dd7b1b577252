// bfloat16 reduction kernels: convert-accumulate-convert. Each kernel widens
// bf16 to fp32 (zero-extend, shift left 16: exact), combines all W inputs in
// fp32 in a fixed order (input 0 first), divides by W for AVG, and narrows
// once with round-to-nearest-even; a NaN result becomes the canonical quiet
// NaN 0x7fc0 (as c10::BFloat16 does). For W == 2 that is exactly torch's
// `a + b` (`a * b`) on bf16 tensors, which computes in fp32 and rounds once.
// MIN / MAX keep this library's std::min / std::max semantics (the
// accumulator wins when a comparison involves NaN), not torch's NaN
// propagation.
//
// Three implementations give bit-identical results:
//   kPortable   plain C++ (blocked loops the compiler may vectorize for the
//               baseline ISA); runs everywhere.
//   kAvx2       hand-written AVX2, 16 elements per step.
//   kAvx512Bf16 AVX-512F + AVX-512 BF16 (VCVTNE2PS2BF16 narrows 32 lanes at
//               once; that instruction flushes denormals and keeps NaN
//               payloads, so a vector holding either is narrowed with the
//               integer rounding instead), 32 elements per step.
// ReduceInto picks the best one the CPU runs once (ChooseBf16Path); tests
// and benchmarks force one with ReduceBf16.
//
// Thread-safety: pure functions over caller-owned memory.
#ifndef TPU_DIST_COLLECTIVES_CORE_BF16_REDUCE_H_
#define TPU_DIST_COLLECTIVES_CORE_BF16_REDUCE_H_

#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "collectives/core/reduce_types.h"

namespace tpudist::collectives {

enum class Bf16Path : uint8_t {
  kPortable = 0,
  kAvx2,
  kAvx512Bf16,
};

absl::string_view Bf16PathName(Bf16Path path);

// The CPU features the paths need (x86-64; all false elsewhere).
struct CpuFeatures {
  bool avx2 = false;
  bool avx512f = false;
  bool avx512bf16 = false;
};

// Features of the CPU this process runs on (cpuid + OS support, via
// __builtin_cpu_supports).
CpuFeatures DetectCpuFeatures();

// True if `path` can execute on a CPU with `cpu` (kPortable: always; also
// false for an x86 path in a build for another architecture).
bool Bf16PathRunnable(Bf16Path path, const CpuFeatures& cpu);

// The fastest runnable path for `cpu`: kAvx512Bf16 if it has AVX-512F and
// AVX-512 BF16, else kAvx2 if it has AVX2, else kPortable. Pure.
Bf16Path ChooseBf16Path(const CpuFeatures& cpu);

// ChooseBf16Path(DetectCpuFeatures()), computed once per process.
Bf16Path DefaultBf16Path();

// out[i] = inputs[0][i] (op) ... (op) inputs[W-1][i] over bf16 bit patterns,
// as described above, for i in [0, count), with the named implementation.
// `out` may equal one of the inputs (in place); no other overlap. No
// alignment is required of any pointer.
// REQUIRES: Bf16PathRunnable(path, DetectCpuFeatures()); kind is kSum, kAvg,
// kProduct, kMin or kMax; !inputs.empty(); every buffer holds `count`
// uint16_t bf16 elements.
void ReduceBf16(Bf16Path path, ReduceKind kind, void* out,
                absl::Span<const void* const> inputs, int64_t count);

// Exact widening of bf16 bits to fp32.
inline float Bf16BitsToFloatInline(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even fp32 -> bf16 bits, NaN -> 0x7fc0. Branch-free so
// loops over it vectorize.
inline uint16_t FloatToBf16BitsInline(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(is_nan ? 0x7fc0u : rounded);
}

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_CORE_BF16_REDUCE_H_
