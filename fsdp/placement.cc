#include "fsdp/placement.h"

#include "absl/strings/str_cat.h"

namespace tpudist::fsdp {

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

std::string Placement::ToString() const {
  switch (kind_) {
    case Kind::kShard: return absl::StrCat("S(", dim_, ")");
    case Kind::kReplicate: return "R";
    case Kind::kPartial: return absl::StrCat("P(", ReduceOpName(op_), ")");
  }
  return "?";
}

bool Placement::operator==(const Placement& o) const {
  if (kind_ != o.kind_) return false;
  if (kind_ == Kind::kShard) return dim_ == o.dim_;
  if (kind_ == Kind::kPartial) return op_ == o.op_;
  return true;
}

std::string PlacementsToString(absl::Span<const Placement> placements) {
  std::string out = "[";
  for (size_t i = 0; i < placements.size(); ++i) {
    if (i > 0) out += ", ";
    out += placements[i].ToString();
  }
  return out + "]";
}

absl::StatusOr<Placements> NormalizePlacements(absl::Span<const Placement> placements,
                                               int64_t tensor_ndim, int64_t mesh_ndim) {
  if (static_cast<int64_t>(placements.size()) != mesh_ndim) {
    return absl::InvalidArgumentError(
        absl::StrCat("placements ", PlacementsToString(placements), " has ", placements.size(),
                     " entries but the device mesh has ", mesh_ndim, " dimensions"));
  }
  Placements out;
  for (const Placement& p : placements) {
    if (!p.is_shard()) {
      out.push_back(p);
      continue;
    }
    const int64_t d = p.dim() < 0 ? p.dim() + tensor_ndim : p.dim();
    if (d < 0 || d >= tensor_ndim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement ", p.ToString(), " is out of range for a ", tensor_ndim, "-d tensor"));
    }
    out.push_back(Placement::Shard(d));
  }
  return out;
}

Placements DefaultGradPlacements(absl::Span<const Placement> placements) {
  Placements out;
  for (const Placement& p : placements) {
    out.push_back(p.is_partial() ? Placement::Replicate() : p);
  }
  return out;
}

}  // namespace tpudist::fsdp
