// Applying tensor-parallel styles to a module tree, torchtitan-style, without
// touching model code.
//
// Model code holds the layers a plan may parallelize as hookable layers
// (nn::Linear, nn::Embedding, or any tpudist::nn::HookableModule that runs its
// forward through RunForward; nn/module_hooks.h, nn/layers.h):
//
//   struct FeedForwardImpl : torch::nn::Module {
//     FeedForwardImpl(int64_t h)
//         : w1(register_module("w1", nn::Linear(h, 4 * h, /*bias=*/false))), ... {}
//     at::Tensor forward(const at::Tensor& x) { return x + w2(at::silu(w1(x))); }
//     nn::Linear w1{nullptr}, w2{nullptr};
//   };
//
// Unparallelized they compute exactly what torch::nn::Linear / Embedding do,
// under the same parameter names. The trainer then applies a plan:
//
//   ParallelizeModule(model.ptr(), tp_mesh,
//                     {{"w1", ColwiseParallel()}, {"w2", RowwiseParallel()}});
//
// which partitions the matched modules' parameters and registers the
// styles' forward hooks on them — the same hooks FullyShard uses, so
// FullyShard may then shard the (already TP-local) parameters over another
// mesh dimension. A plan key matching a module that is not a HookableModule
// is an error naming it.
//
// Thread-safety: parallelizing mutates the modules; do it before training,
// from one thread per rank. Forward/backward are collective over the mesh.
#ifndef TPU_DIST_FSDP_PARALLELIZE_MODULE_H_
#define TPU_DIST_FSDP_PARALLELIZE_MODULE_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "fsdp/device_mesh.h"
#include "fsdp/tensor_parallel.h"

namespace tpudist::fsdp {

// {submodule FQN pattern -> style}, applied in order. `*` matches any run of
// characters, dots included (Python fnmatch), so "layers.*.w1" matches
// "layers.0.w1"; "" is the root itself.
using ParallelizePlan = std::vector<std::pair<std::string, std::shared_ptr<const ParallelStyle>>>;

// Whether `fqn` matches `pattern` (pure; see ParallelizePlan).
bool FqnMatches(absl::string_view pattern, absl::string_view fqn);

// Applies `plan` to `root`'s submodules. Errors: a mesh that is not 1-D
// (pass mesh.Slice("tp")), a pattern that matches no module (NotFound), a
// match that is not a HookableModule or already has a style
// (FailedPrecondition), or a style that does not support the module type
// (InvalidArgument). Collective: every rank of the mesh calls it with the
// same plan.
absl::Status ParallelizeModule(const std::shared_ptr<torch::nn::Module>& root,
                               const DeviceMesh& mesh, const ParallelizePlan& plan);

// The tensor-parallel placement of every parameter a style partitioned,
// keyed by its FQN relative to `root` (parameters without a style are
// absent: they are whole on every tp rank). For checkpoints and gradient
// clipping over TP-sharded parameters.
std::map<std::string, TpParamPlacement> TensorParallelPlacements(torch::nn::Module& root);

// After backward, before clipping or the optimizer step: sums over each
// style's tp mesh the gradients its style left partial (partial_grad, e.g.
// ReplicateWithPartialGrad), in place. Works on whole gradients and on
// FullyShard's dp shards alike (the same index range on every tp rank of a
// dp coordinate). Parameters without a gradient are skipped. Collective over
// every tp mesh used; every rank calls it after every backward.
absl::Status AllReducePartialGrads(torch::nn::Module& root);

// The style applied to `module` by ParallelizeModule, or "" when none.
std::string TensorParallelStyleOf(const nn::HookableModule& module);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_PARALLELIZE_MODULE_H_
