// Pure arithmetic of a device mesh: validation of a shape, the row-major
// coordinate of a rank, and the groups of ranks that vary along one mesh
// dimension. DeviceMesh (fsdp/device_mesh.h) builds on these; nothing here
// talks to a process group.
//
// A mesh is an n-D array of global ranks stored flat in row-major order (the
// last dimension varies fastest). InitDeviceMesh lays out ranks 0..world-1;
// a sub-mesh carries the subset of ranks it was sliced to.
//
// Example, shape {2, 4} ("dp", "tp"), ranks 0..7:
//   coordinate of rank 6 = {1, 2}
//   group along "tp" through rank 6 = {4, 5, 6, 7}
//   group along "dp" through rank 6 = {2, 6}
//
// All functions are pure and thread-safe.
#ifndef TPU_DIST_FSDP_MESH_MATH_H_
#define TPU_DIST_FSDP_MESH_MATH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tpudist::fsdp {

// OK when every size is >= 1, their product equals `num_ranks`, and the names
// are either empty (an unnamed mesh) or one per dimension, non-empty and
// distinct. Errors name the shape, the product and the offending name.
absl::Status ValidateMeshShape(absl::Span<const int64_t> shape,
                               absl::Span<const std::string> dim_names,
                               int64_t num_ranks);

// Product of the sizes (1 for a 0-d shape).
int64_t MeshNumel(absl::Span<const int64_t> shape);

// Row-major coordinate of flat index `index`.
// REQUIRES: 0 <= index < MeshNumel(shape).
std::vector<int64_t> UnravelIndex(absl::Span<const int64_t> shape,
                                  int64_t index);

// Flat row-major index of `coordinate`. REQUIRES: coordinate inside shape.
int64_t RavelIndex(absl::Span<const int64_t> shape,
                   absl::Span<const int64_t> coordinate);

// Coordinate of global rank `rank` in a mesh whose flat rank array is
// `ranks`. NotFound when the rank is not in the mesh.
// REQUIRES: ranks.size() == MeshNumel(shape).
absl::StatusOr<std::vector<int64_t>> CoordinateOfRank(
    absl::Span<const int64_t> shape, absl::Span<const int> ranks, int rank);

// The ranks of the sub-mesh through `coordinate` that keeps `keep_dims` (in
// that order) and fixes every other dimension at its coordinate, flat in
// row-major order of the kept dimensions.
// REQUIRES: keep_dims distinct and in [0, shape.size()).
std::vector<int> SubMeshRanks(absl::Span<const int64_t> shape,
                              absl::Span<const int> ranks,
                              absl::Span<const int64_t> coordinate,
                              absl::Span<const int> keep_dims);

// Every 1-D group along mesh dimension `dim`, ordered by the flat index of the
// group's first member; each group is ordered by its coordinate along `dim`.
// There are MeshNumel(shape) / shape[dim] groups of shape[dim] ranks.
std::vector<std::vector<int>> GroupsAlongDim(absl::Span<const int64_t> shape,
                                             absl::Span<const int> ranks,
                                             int dim);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_MESH_MATH_H_
