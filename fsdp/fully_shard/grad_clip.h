// Gradient clipping by the global L2 norm of a FullyShard-ed model
// (torch.nn.utils.clip_grad_norm_ over DTensor grads).
//
// The squared norm is the sum over ranks of the squares of the sharded
// gradients (each element lives on exactly one rank; padding is never part
// of a shard), all-reduced (SUM) over the mesh, plus the squares of the
// gradients of parameters no group owns (replicated: counted once).
// If total > max_norm every gradient is scaled by max_norm / (total + 1e-6),
// the same coefficient clip_grad_norm_ uses. Collective over the mesh.
//
// On a ("dp", "tp") mesh (FullyShard over dp, tensor parallelism over tp)
// a tensor-parallel piece (fsdp/global_layout.h) is summed over tp as well,
// and a parameter replicated over tp is counted once, so the norm is the
// norm of the full model's gradient. On an HSDP ("dp_replicate",
// "dp_shard") mesh the shards are summed over dp_shard only. REQUIRES there: partial gradients
// already summed (AllReducePartialGrads), so replicas agree.
#ifndef TPU_DIST_FSDP_FULLY_SHARD_GRAD_CLIP_H_
#define TPU_DIST_FSDP_FULLY_SHARD_GRAD_CLIP_H_

#include <memory>

#include <torch/nn/module.h>

#include "absl/status/statusor.h"
#include "fsdp/device_mesh.h"

namespace tpudist::fsdp {

// Returns the total norm before clipping. REQUIRES: after backward (grads
// are shards).
absl::StatusOr<double> ClipGradNorm(const std::shared_ptr<torch::nn::Module>& model,
                                    const DeviceMesh& mesh, double max_norm);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_FULLY_SHARD_GRAD_CLIP_H_
