// Conversions between torch / c10d types and the raw-byte shm layer, and the
// one place where absl::Status becomes a c10::Error exception.
//
// Thread-safety: pure functions.
#ifndef TPU_DIST_COLLECTIVES_TENSOR_BRIDGE_H_
#define TPU_DIST_COLLECTIVES_TENSOR_BRIDGE_H_

#include <ATen/ATen.h>

#include <vector>

#include "absl/container/inlined_vector.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "collectives/core/reduce_kernels.h"
#include "torch/csrc/distributed/c10d/Types.hpp"

namespace tpudist::collectives {

// dtype of a supported tensor; InvalidArgument naming `op` otherwise.
absl::StatusOr<DataType> ToDataType(at::ScalarType type, const char* op);

// c10d reduce op -> kernel op; PREMUL_SUM is Unimplemented.
absl::StatusOr<ReduceKind> ToReduceKind(const c10d::ReduceOp& op);
// The kind for reducing `dtype`: bool SUM -> BOR, bool PRODUCT -> BAND (as
// torch's Gloo computes them), otherwise ToReduceKind(op).
absl::StatusOr<ReduceKind> ToReduceKind(const c10d::ReduceOp& op,
                                             DataType dtype);

// Throws c10::Error carrying `status` if it is not OK. The only status ->
// exception bridge of the process group.
void ThrowIfError(const absl::Status& status);

// A contiguous tensor with the contents of `t` ([any]); `t` itself when it is
// already contiguous.
at::Tensor ContiguousBuffer(const at::Tensor& t);

// After an op wrote into `buffer` (from ContiguousBuffer(t)), copies it back
// into `t` if they differ. Both [same shape].
void CopyBackIfNeeded(at::Tensor& t, const at::Tensor& buffer);

// Shape as OpSpec::shape wants it, for op headers (no allocation up to 6 dims).
absl::InlinedVector<int64_t, 6> ShapeOf(const at::Tensor& t);

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_TENSOR_BRIDGE_H_
