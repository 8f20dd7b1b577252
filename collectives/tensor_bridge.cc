#include "collectives/tensor_bridge.h"

#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"

namespace tpudist::collectives {

absl::StatusOr<DataType> ToDataType(at::ScalarType type, const char* op) {
  switch (type) {
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kHalf: return DataType::kFloat16;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kByte: return DataType::kUInt8;
    case at::kChar: return DataType::kInt8;
    case at::kShort: return DataType::kInt16;
    case at::kBool: return DataType::kBool;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": unsupported dtype ", c10::toString(type),
          " (tpu_dist supports float32, float64, bfloat16, float16, int64, int32, "
          "int16, int8, uint8, bool; complex through torch.distributed's real view)"));
  }
}

absl::StatusOr<ReduceKind> ToReduceKind(const c10d::ReduceOp& op,
                                             DataType dtype) {
  absl::StatusOr<ReduceKind> kind = ToReduceKind(op);
  // As torch's Gloo: a bool SUM is a logical or, a PRODUCT a logical and.
  if (kind.ok() && dtype == DataType::kBool) {
    if (*kind == ReduceKind::kSum) return ReduceKind::kBor;
    if (*kind == ReduceKind::kProduct) return ReduceKind::kBand;
  }
  return kind;
}

absl::StatusOr<ReduceKind> ToReduceKind(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceKind::kSum;
    case c10d::ReduceOp::AVG: return ReduceKind::kAvg;
    case c10d::ReduceOp::PRODUCT: return ReduceKind::kProduct;
    case c10d::ReduceOp::MIN: return ReduceKind::kMin;
    case c10d::ReduceOp::MAX: return ReduceKind::kMax;
    case c10d::ReduceOp::BAND: return ReduceKind::kBand;
    case c10d::ReduceOp::BOR: return ReduceKind::kBor;
    case c10d::ReduceOp::BXOR: return ReduceKind::kBxor;
    default:
      return absl::UnimplementedError(
          "tpu_dist does not support PREMUL_SUM reductions");
  }
}

void ThrowIfError(const absl::Status& status) {
  TORCH_CHECK(status.ok(), "tpu_dist: ", status.ToString());
}

at::Tensor ContiguousBuffer(const at::Tensor& t) {
  return t.is_contiguous() ? t : t.contiguous();
}

void CopyBackIfNeeded(at::Tensor& t, const at::Tensor& buffer) {
  if (!t.is_same(buffer)) t.copy_(buffer);
}

absl::InlinedVector<int64_t, 6> ShapeOf(const at::Tensor& t) {
  return absl::InlinedVector<int64_t, 6>(t.sizes().begin(), t.sizes().end());
}

}  // namespace tpudist::collectives
