#include "fsdp/mesh_math.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tpudist::fsdp {

absl::Status ValidateMeshShape(absl::Span<const int64_t> shape,
                               absl::Span<const std::string> dim_names,
                               int64_t num_ranks) {
  const std::string shape_str = absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
  if (shape.empty()) {
    return absl::InvalidArgumentError("device mesh shape must have at least one dimension");
  }
  for (int64_t s : shape) {
    if (s < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("device mesh shape ", shape_str, " has a dimension of size ", s,
                       "; every size must be >= 1"));
    }
  }
  const int64_t numel = MeshNumel(shape);
  if (numel != num_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("device mesh shape ", shape_str, " holds ", numel,
                     " devices but the world has ", num_ranks, " ranks"));
  }
  if (dim_names.empty()) return absl::OkStatus();
  if (dim_names.size() != shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device mesh shape ", shape_str, " has ", shape.size(),
                     " dimensions but ", dim_names.size(), " names were given (",
                     absl::StrJoin(dim_names, ", "), ")"));
  }
  std::set<std::string> seen;
  for (const std::string& name : dim_names) {
    if (name.empty()) {
      return absl::InvalidArgumentError("device mesh dimension names must be non-empty");
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("device mesh dimension name '", name, "' appears twice in (",
                       absl::StrJoin(dim_names, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

int64_t MeshNumel(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<int64_t> UnravelIndex(absl::Span<const int64_t> shape, int64_t index) {
  std::vector<int64_t> coord(shape.size(), 0);
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    coord[d] = index % shape[d];
    index /= shape[d];
  }
  return coord;
}

int64_t RavelIndex(absl::Span<const int64_t> shape, absl::Span<const int64_t> coordinate) {
  int64_t index = 0;
  for (size_t d = 0; d < shape.size(); ++d) index = index * shape[d] + coordinate[d];
  return index;
}

absl::StatusOr<std::vector<int64_t>> CoordinateOfRank(absl::Span<const int64_t> shape,
                                                      absl::Span<const int> ranks, int rank) {
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == rank) return UnravelIndex(shape, static_cast<int64_t>(i));
  }
  return absl::NotFoundError(absl::StrCat("rank ", rank, " is not in the device mesh [",
                                          absl::StrJoin(ranks, ", "), "]"));
}

std::vector<int> SubMeshRanks(absl::Span<const int64_t> shape, absl::Span<const int> ranks,
                              absl::Span<const int64_t> coordinate,
                              absl::Span<const int> keep_dims) {
  std::vector<int64_t> sub_shape;
  for (int d : keep_dims) sub_shape.push_back(shape[d]);
  const int64_t n = MeshNumel(sub_shape);
  std::vector<int> out;
  out.reserve(n);
  std::vector<int64_t> coord(coordinate.begin(), coordinate.end());
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int64_t> sub = UnravelIndex(sub_shape, i);
    for (size_t k = 0; k < keep_dims.size(); ++k) coord[keep_dims[k]] = sub[k];
    out.push_back(ranks[RavelIndex(shape, coord)]);
  }
  return out;
}

std::vector<std::vector<int>> GroupsAlongDim(absl::Span<const int64_t> shape,
                                             absl::Span<const int> ranks, int dim) {
  std::vector<std::vector<int>> groups;
  const int64_t n = MeshNumel(shape);
  const int keep[] = {dim};
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int64_t> coord = UnravelIndex(shape, i);
    if (coord[dim] != 0) continue;  // one group per slice, found at its first member
    groups.push_back(SubMeshRanks(shape, ranks, coord, keep));
  }
  return groups;
}

}  // namespace tpudist::fsdp
