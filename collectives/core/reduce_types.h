// The element types and reduction operators every reducing algorithm names:
// the vocabulary of reduce_kernels.h and bf16_reduce.h, apart so that the
// bf16 kernels need not include the dispatcher that calls them.
//
// Thread-safety: types only.
#ifndef TPU_DIST_COLLECTIVES_CORE_REDUCE_TYPES_H_
#define TPU_DIST_COLLECTIVES_CORE_REDUCE_TYPES_H_

#include <cstdint>

namespace tpudist::collectives {

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

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_CORE_REDUCE_TYPES_H_
