// FullyShard: FSDP2-style per-parameter sharding of a libtorch module.
//
//   for (auto& layer : model->layers) FullyShard(layer, mesh, opts);   // bottom-up
//   FsdpModule root = *FullyShard(model, mesh, opts);                  // then the root
//   torch::optim::AdamW opt(model->parameters(), ...);                 // sees only shards
//   loss = f(model->forward(x)); loss.backward(); opt.step();
//
// THE RULE: a module passed to FullyShard must derive from
// tpudist::nn::HookableModule and run its whole forward through
// RunForward (nn/module_hooks.h), and the tensors it returns must
// be what the loss depends on. Modules without FullyShard need nothing.
//
// Each call forms one group from module->parameters() minus those already
// owned by an inner FullyShard and minus options.ignored_params; every
// grouped parameter is sharded in place (data = this rank's Shard(0) piece,
// torch.chunk semantics, padded in the flat buffers; see fsdp_param_group.h).
// A parameter that another FullyShard group outside this subtree already
// owns (a weight tied across groups) is an error.
//
// Runtime (hooks installed on the module, no class swap):
//   pre-forward   all-gather this group (ONE collective) unless already
//                 prefetched; cast floating inputs to param_dtype; issue the
//                 all-gather of the next group in the recorded forward order
//   post-forward  reshard if reshard_after_forward; hook the outputs' grads
//   pre-backward  (output grad arrives) re-gather, prefetch the group that
//                 ran before this one in forward
//   grads ready   reduce-scatter (ONE collective, AVG, reduce_dtype) into
//                 fp32 shard grads, reshard
//   end of backward (engine callback) wait all reduce-scatters, reshard
//                 everything, check every group finished
// The outermost FullyShard module that runs forward first is the root: it
// owns the shared per-iteration context (orders, memory accounting).
// Prefetch assumes the same module order every iteration (static graph).
//
// Thread-safety: one training thread per rank; collective over the mesh
// (every rank builds the same model and calls FullyShard identically).
#ifndef TPU_DIST_FSDP_FULLY_SHARD_FULLY_SHARD_H_
#define TPU_DIST_FSDP_FULLY_SHARD_FULLY_SHARD_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "absl/status/statusor.h"
#include "fsdp/device_mesh.h"
#include "fsdp/dtensor.h"
#include "fsdp/fully_shard/fsdp_param_group.h"
#include "nn/module_hooks.h"

namespace tpudist::fsdp {

struct FullyShardOptions {
  // nullopt: true, except false for the root (it is needed first in backward).
  std::optional<bool> reshard_after_forward;
  MixedPrecisionPolicy mp_policy;
  // Not sharded, not gathered, grads not reduced (e.g. a frozen embedding).
  std::vector<at::Tensor> ignored_params;
  bool prefetch = true;  // forward and backward prefetch of the next group
  std::string label;     // for errors and traces; "" = module->name()
};

// Time spent in one FullyShard phase, summed over groups and calls.
struct FsdpPhaseTime {
  double wall_s = 0;
  double cpu_s = 0;  // the calling thread's CPU time
  int64_t calls = 0;
};

// Per-iteration counters the root keeps; for tests and benchmarks.
struct FsdpStats {
  int64_t live_unsharded_bytes = 0;  // full params alive now
  int64_t peak_unsharded_bytes = 0;  // max since ResetPeak
  std::vector<std::string> trace;    // events when tracing is on
  bool tracing = false;
  // Off by default (no clock is read): with timing on, every group's phases
  // (see FsdpParamGroup::set_phase_timer) add up here, by phase name.
  bool timing = false;
  std::map<std::string, FsdpPhaseTime> phase_times;
};

class FsdpState;

// A handle on a FullyShard-ed module (cheap to copy; shares the state that
// lives on the module as an attachment).
class FsdpModule {
 public:
  explicit FsdpModule(std::shared_ptr<FsdpState> state) : state_(std::move(state)) {}

  FsdpParamGroup& group() const;
  // This and every FullyShard module below (pre-order).
  std::vector<FsdpModule> Subtree() const;
  // FSDP2's set_requires_gradient_sync(recurse=True): with false, backward
  // accumulates unsharded grads and issues no reduce-scatter.
  void SetRequiresGradientSync(bool sync) const;
  void SetReshardAfterForward(bool reshard) const;
  // Explicit unshard/reshard (e.g. to read full weights between steps).
  absl::Status Unshard() const;
  absl::Status Reshard() const;
  // Root-only counters (the root's after the first forward).
  FsdpStats& stats() const;
  // Sharded parameters as DTensors (name relative to this module).
  absl::StatusOr<std::vector<std::pair<std::string, DTensor>>> ShardedParameters() const;
  const std::shared_ptr<FsdpState>& state() const { return state_; }

 private:
  std::shared_ptr<FsdpState> state_;
};

// Shards `module` in place and installs the hooks. Errors: the module is not
// a HookableModule, already FullyShard-ed, a parameter is owned by another
// group, the mesh is neither 1-D nor ("dp_replicate", "dp_shard"), or it
// disagrees with its process groups.
//
// HSDP (torch FSDP2's fully_shard(mesh=2-D)): on a 2-D ("dp_replicate",
// "dp_shard") mesh parameters are sharded over dp_shard and replicated
// over dp_replicate; all-gathers run over dp_shard; in backward
// the grads are reduce-scattered (AVG) over dp_shard, then the shards are
// all-reduced (AVG) over dp_replicate, so the grad is the mean over all
// R x S ranks, as torch's foreach_reduce computes it for fp32/bf16.
absl::StatusOr<FsdpModule> FullyShard(const std::shared_ptr<torch::nn::Module>& module,
                                      const DeviceMesh& mesh, const FullyShardOptions& options = {});

// The FullyShard handle of `module`, if any.
std::optional<FsdpModule> GetFsdpModule(torch::nn::Module& module);

// Whether `param` is owned by some FullyShard group, and which (label).
std::optional<std::string> FsdpOwner(const at::Tensor& param);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_FULLY_SHARD_FULLY_SHARD_H_
