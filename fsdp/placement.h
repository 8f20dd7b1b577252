// How a DTensor's logical (global) tensor is laid out along one mesh
// dimension, with PyTorch 2.x DTensor semantics:
//
//   Shard(d)     each coordinate along the mesh dim holds one torch.chunk
//                piece of tensor dim d (trailing pieces may be short/empty).
//   Replicate()  every coordinate holds the whole tensor.
//   Partial(op)  every coordinate holds a tensor of the full shape; the
//                logical value is the reduction (sum, avg, max, min) of them.
//
// Placement is a small value type: copyable, comparable, thread-safe.
#ifndef TPU_DIST_FSDP_PLACEMENT_H_
#define TPU_DIST_FSDP_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tpudist::fsdp {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* ReduceOpName(ReduceOp op);

class Placement {
 public:
  enum class Kind { kShard, kReplicate, kPartial };

  static Placement Shard(int64_t dim) { return Placement(Kind::kShard, dim, ReduceOp::kSum); }
  static Placement Replicate() { return Placement(Kind::kReplicate, 0, ReduceOp::kSum); }
  static Placement Partial(ReduceOp op = ReduceOp::kSum) {
    return Placement(Kind::kPartial, 0, op);
  }

  Kind kind() const { return kind_; }
  bool is_shard() const { return kind_ == Kind::kShard; }
  bool is_shard(int64_t dim) const { return is_shard() && dim_ == dim; }
  bool is_replicate() const { return kind_ == Kind::kReplicate; }
  bool is_partial() const { return kind_ == Kind::kPartial; }
  // Tensor dimension of a Shard; may be negative until normalized.
  int64_t dim() const { return dim_; }
  ReduceOp reduce_op() const { return op_; }

  // "S(0)", "R", "P(sum)".
  std::string ToString() const;

  bool operator==(const Placement& o) const;
  bool operator!=(const Placement& o) const { return !(*this == o); }

 private:
  Placement(Kind kind, int64_t dim, ReduceOp op) : kind_(kind), dim_(dim), op_(op) {}
  Kind kind_;
  int64_t dim_;
  ReduceOp op_;
};

using Placements = std::vector<Placement>;

// "[S(0), R]".
std::string PlacementsToString(absl::Span<const Placement> placements);

// Copies `placements` with negative Shard dims wrapped by `tensor_ndim`
// (Shard(-1) of a 3-d tensor is Shard(2)). InvalidArgument when a dim is out
// of range or the count differs from `mesh_ndim`.
absl::StatusOr<Placements> NormalizePlacements(absl::Span<const Placement> placements,
                                               int64_t tensor_ndim, int64_t mesh_ndim);

// The layout a gradient of a tensor placed as `placements` has by default:
// Shard and Replicate are kept; Partial becomes Replicate (the gradient of a
// sum with respect to each summand is the full gradient). See docs/dtensor.md.
Placements DefaultGradPlacements(absl::Span<const Placement> placements);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_PLACEMENT_H_
