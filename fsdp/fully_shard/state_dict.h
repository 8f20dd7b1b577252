// Model state dicts of a FullyShard-ed model (torch.distributed.checkpoint
// .state_dict's get/set_model_state_dict, for our groups).
//
//   full_state_dict = true:  GetModelStateDict gathers every sharded
//     parameter (one all-gather per group, master dtype) and returns full
//     tensors, keyed by the root's named_parameters() / named_buffers() FQNs,
//     on rank 0 only (others get an empty map). SetModelStateDict takes the
//     full dict on rank 0 (others pass anything, e.g. {}) and broadcasts it,
//     one broadcast per group; each rank keeps its rows.
//   full_state_dict = false: this rank's local shards (and unsharded
//     parameters/buffers as they are); Set expects the same layout.
//
// Parameters not owned by any group (ignored) and buffers are taken as they
// are on rank 0 and broadcast on Set. Collective over the mesh: all ranks
// call with the same options. REQUIRES: parameters sharded (between steps).
//
// Meshes: FullyShard's 1-D mesh, or a 2-D ("dp", "tp") mesh (FullyShard over
// dp, tensor parallelism over tp; fsdp/global_layout.h says where each TP
// piece sits). On a 1-D mesh a tensor-parallel parameter is returned as this
// rank's TP piece. On the 2-D mesh the full dict holds full tensors: dp row 0
// gathers each TP piece over tp (torch.chunk pieces along one dim) and the
// dict lands on mesh coordinate (0, 0) only (HoldsFullStateDict). Setting a
// full dict on the 2-D mesh is Unimplemented (load before parallelizing, or
// use LoadShardedCheckpoint).
//
// HSDP (a ("dp_replicate", "dp_shard") mesh, FullyShard over dp_shard,
// replicated over dp_replicate): sharded dicts are this rank's dp_shard
// shard (replicas hold equal ones); a full dict is gathered over dp_shard
// and returned on coordinate (0, 0) only; a full Set broadcasts from (0, 0)
// along dp_replicate, then along dp_shard.
#ifndef TPU_DIST_FSDP_FULLY_SHARD_STATE_DICT_H_
#define TPU_DIST_FSDP_FULLY_SHARD_STATE_DICT_H_

#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fsdp/device_mesh.h"
#include "fsdp/fully_shard/fsdp_param_group.h"

namespace tpudist::fsdp {

struct StateDictOptions {
  bool full_state_dict = true;
  bool cpu_offload = true;            // results are CPU copies (always CPU here)
  bool ignore_frozen_params = false;  // skip requires_grad=false parameters
};

using StateDict = std::map<std::string, at::Tensor>;

// Every FullyShard group under (and including) `model` in pre-order, and
// which group/index owns each parameter.
struct FsdpGroupIndex {
  std::vector<FsdpParamGroup*> groups;
  std::unordered_map<const c10::TensorImpl*, std::pair<FsdpParamGroup*, size_t>> owner;
};
FsdpGroupIndex IndexFsdpGroups(const std::shared_ptr<torch::nn::Module>& model);

// Mesh dim holding tensor parallelism: 0 for a 1-D mesh or an HSDP mesh
// (none), 1 for a ("dp", "tp") mesh; InvalidArgument naming the mesh
// otherwise.
absl::StatusOr<int> TensorParallelDim(const DeviceMesh& mesh);

// A 2-D ("dp_replicate", "dp_shard") mesh: FullyShard's HSDP.
bool IsHsdpMesh(const DeviceMesh& mesh);
// The dim FullyShard shards over: 1 on an HSDP mesh, else 0.
int FsdpShardDim(const DeviceMesh& mesh);

// True on the one rank that a full GetModelStateDict returns the dict on
// (mesh coordinate all zeros).
bool HoldsFullStateDict(const DeviceMesh& mesh);

absl::StatusOr<StateDict> GetModelStateDict(const std::shared_ptr<torch::nn::Module>& model,
                                            const DeviceMesh& mesh,
                                            const StateDictOptions& options = {});

// InvalidArgument (on every rank) when rank 0's dict lacks a needed key or a
// shape disagrees; nothing is modified then.
absl::Status SetModelStateDict(const std::shared_ptr<torch::nn::Module>& model,
                               const DeviceMesh& mesh, const StateDict& state,
                               const StateDictOptions& options = {});

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_FULLY_SHARD_STATE_DICT_H_
