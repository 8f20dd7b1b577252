// Tensor-parallel styles (PyTorch 2.x torch.distributed.tensor.parallel
// semantics) for a 1-D mesh, applied as forward hooks on
// tpudist::nn::HookableModules through ParallelizeModule
// (fsdp/parallelize_module.h) — the same hook system FullyShard uses, so one
// plan applies TP and FSDP to the same modules (torchtitan's pattern).
//
// Applying a style to a module does two things, once:
//   partition  shards (or replicates) the module's parameters in place:
//              param.set_data(local piece), so names, optimizers and
//              state_dict keep working on the local pieces;
//   hooks      a pre-forward hook converts the input from `input_layouts` to
//              what the module needs, a post-forward hook converts the
//              local output to `output_layouts` (returned as a local tensor,
//              PyTorch's use_local_output=True). The module's own forward
//              runs unchanged on local tensors in between.
// Layouts of inputs that are local tensors are declared, not checked: a
// Shard input's global size is the local size times the mesh size (as
// PyTorch's from_local(run_check=False)), so sharded *inputs* must be even.
// Parameter shards follow torch.chunk and may be uneven.
//
//   ColwiseParallel   nn::Linear weight [out, in] and bias -> Shard(0);
//                     nn::Embedding weight -> Shard(1). In: Replicate, out:
//                     Shard(-1). Backward all-reduces (or reduce-scatters,
//                     for a Shard input) the input gradient.
//   RowwiseParallel   nn::Linear weight -> Shard(1), bias Replicate (added
//                     by the post-hook after the reduction); nn::Embedding
//                     weight -> Shard(0) (ids out of the local vocab range
//                     contribute zeros; every rank's piece must be
//                     non-empty). In: Shard(-1) (Linear) / Replicate
//                     (Embedding); out: Replicate via all_reduce, or Shard(d)
//                     via reduce_scatter.
//   SequenceParallel  any HookableModule: parameters Replicate; input and
//                     output Shard(seq dim); the module runs on its sequence
//                     shard and parameter gradients are all-reduced over the
//                     mesh in backward.
//   PrepareModuleInput  any HookableModule: converts the first input from
//                     `input_layouts` to `desired_input_layouts`.
//   ReplicateWithPartialGrad  any HookableModule: parameters Replicate, no
//                     layout change; each rank's gradient is a partial sum
//                     (the module saw only this rank's heads, e.g. a per-head
//                     norm). The parameters are marked partial_grad and
//                     AllReducePartialGrads sums them after backward — an
//                     explicit step, not a tensor hook, because FullyShard
//                     owns the parameters' autograd hook slot, and because
//                     all-reducing over tp the dp-reduce-scattered shards is
//                     the same sum (linear).
//   ReplicateOutputWithPartialGrad  any HookableModule: parameters
//                     Replicate; the output is replicated and feeds rank-local
//                     computations (e.g. one KV head read by this rank's
//                     query heads), so its gradient is a partial sum: the
//                     post-hook is the identity in forward and all-reduces
//                     the output gradient in backward. Everything upstream
//                     (the module's own parameters, earlier layers) then
//                     gets whole gradients.
//
// Errors raised inside hooks (a collective failing, a layout that does not
// fit) are thrown as std::runtime_error naming the style, module and rank
// (the torch boundary).
//
// Styles are immutable values, safe to share between layers and threads;
// the hooks they install are collective over the mesh.
#ifndef TPU_DIST_FSDP_TENSOR_PARALLEL_H_
#define TPU_DIST_FSDP_TENSOR_PARALLEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fsdp/device_mesh.h"
#include "fsdp/placement.h"
#include "nn/module_hooks.h"

namespace tpudist::fsdp {

// Where one direct parameter of a TP-parallelized module lives: this rank
// holds full.narrow(dim, offset, local_size) (dim < 0: replicated whole).
// For checkpoints that reload on another layout.
struct TpParamPlacement {
  int64_t dim = -1;                // sharded dim over the tp mesh, -1 = Replicate
  int64_t offset = 0;              // this rank's start along dim
  std::vector<int64_t> full_shape; // global shape before partition
  // The gradient is a partial sum over the tp ranks until
  // AllReducePartialGrads (fsdp/parallelize_module.h) sums it.
  bool partial_grad = false;
};

class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  // Partitions `module`'s parameters over `mesh` (1-D; broadcast from the
  // mesh's first rank first, as PyTorch's src_data_rank=0) and registers the
  // style's hooks on it. Returns each partitioned direct (or, for styles
  // over whole subtrees, recursive) parameter's placement, keyed by its name
  // relative to `module`. InvalidArgument for a module type the style does
  // not support. Collective over the mesh.
  virtual absl::Status Apply(nn::HookableModule& module, const DeviceMesh& mesh,
                             std::vector<std::pair<std::string, TpParamPlacement>>* placements) const = 0;
  virtual std::string Name() const = 0;
};

struct ColwiseParallelOptions {
  Placement input_layout = Placement::Replicate();
  Placement output_layout = Placement::Shard(-1);
};
std::shared_ptr<const ParallelStyle> ColwiseParallel(ColwiseParallelOptions options = {});

struct RowwiseParallelOptions {
  // nullopt: Shard(-1) for Linear, Replicate for Embedding. torch's
  // RowwiseParallel() declares an Embedding's ids Shard(-1) too (and
  // all-gathers them); pass Shard(-1) for that, or write the torch plan as
  // RowwiseParallel(input_layouts=Replicate()) as torchtitan does. Both are
  // checked against torch in tensor_parallel_oracle_test.cc.
  std::optional<Placement> input_layout;
  Placement output_layout = Placement::Replicate();
};
std::shared_ptr<const ParallelStyle> RowwiseParallel(RowwiseParallelOptions options = {});

std::shared_ptr<const ParallelStyle> SequenceParallel(int64_t sequence_dim = 1);

std::shared_ptr<const ParallelStyle> PrepareModuleInput(Placement input_layout,
                                                        Placement desired_input_layout);

std::shared_ptr<const ParallelStyle> ReplicateWithPartialGrad();

std::shared_ptr<const ParallelStyle> ReplicateOutputWithPartialGrad();

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_TENSOR_PARALLEL_H_
