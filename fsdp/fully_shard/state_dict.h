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
