// Small agreements over every rank of an n-D DeviceMesh, which has one
// process group per dim and none over all ranks: the collectives run along
// each dim in turn. Used by the sharded checkpoint writer.
//
// Collective over the mesh: every rank calls with the same mesh, in the same
// order as its other collectives. Thread-safety: as the mesh's groups.
#ifndef TPU_DIST_FSDP_FULLY_SHARD_MESH_AGREEMENT_H_
#define TPU_DIST_FSDP_FULLY_SHARD_MESH_AGREEMENT_H_

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fsdp/device_mesh.h"

namespace tpudist::fsdp {

// This rank's row-major index in `mesh` (last dim fastest), 0..size()-1.
int64_t MeshFlatRank(const DeviceMesh& mesh);

// All-reduce MIN of ok-ness: `mine` when it failed; Aborted ("<what>:
// failed on another rank") when another rank's did; DeadlineExceeded /
// Internal when the collective itself failed; else OK on every rank.
absl::Status AgreeOnStatus(const DeviceMesh& mesh, const absl::Status& mine, absl::string_view what);

// Every rank's `mine`, indexed by MeshFlatRank (variable-length: lengths,
// then padded bytes, along each dim from the last). Errors name `what`.
absl::StatusOr<std::vector<nlohmann::json>> AllGatherJson(const DeviceMesh& mesh, const nlohmann::json& mine,
                                                          absl::string_view what);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_FULLY_SHARD_MESH_AGREEMENT_H_
