// Tensor-parallel styles (PyTorch 2.x torch.distributed.tensor.parallel
// semantics) for a 1-D mesh, applied through ParallelLayer / ParallelizeModule
// (fsdp/parallelize_module.h).
//
// libtorch modules have no forward hooks and their forward is not virtual,
// so a style is two things:
//   Partition  shards (or replicates) the module's parameters in place:
//              param.set_data(local piece), so names, optimizers and
//              state_dict keep working on the local shards.
//   Forward    runs the module with layout conversions around it: the input
//              is read in `input_layouts`, redistributed to what the module
//              needs, the module's own forward runs on local tensors, and
//              the output is redistributed to `output_layouts` and returned
//              as a local tensor (PyTorch's use_local_output=True).
// Layouts of inputs that are local tensors are declared, not checked: a
// Shard input's global size is the local size times the mesh size (as
// PyTorch's from_local(run_check=False)), so sharded *inputs* must be even.
// Parameter shards follow torch.chunk and may be uneven.
//
//   ColwiseParallel   Linear weight [out, in] and bias -> Shard(0); Embedding
//                     weight -> Shard(1). In: Replicate, out: Shard(-1).
//                     Backward all-reduces (or reduce-scatters, for a
//                     Shard input) the input gradient.
//   RowwiseParallel   Linear weight -> Shard(1), bias Replicate (added after
//                     the reduction); Embedding weight -> Shard(0) (ids out of
//                     the local vocab range contribute zeros). In: Shard(-1)
//                     (Linear) / Replicate (Embedding); out: Replicate via
//                     all_reduce, or Shard(d) via reduce_scatter.
//   SequenceParallel  parameters Replicate; input and output Shard(seq dim);
//                     the module runs on its sequence shard and parameter
//                     gradients are all-reduced over the mesh in backward.
//   PrepareModuleInput  converts the input from `input_layouts` to
//                     `desired_input_layouts` before the module runs.
//
// Styles are immutable values, safe to share between layers and threads;
// Forward is collective over the mesh.
#ifndef FSDP_TENSOR_PARALLEL_H_
#define FSDP_TENSOR_PARALLEL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fsdp/device_mesh.h"
#include "fsdp/placement.h"

namespace tpudist::fsdp {

// What a style's Forward sees of the layer it runs in.
struct LayerContext {
  torch::nn::AnyModule* inner = nullptr;  // the wrapped module
  torch::nn::Module* module = nullptr;    // the same, untyped
  const DeviceMesh* mesh = nullptr;       // 1-D
  // Global shape of each direct parameter before Partition ("weight" -> {out, in}).
  const std::map<std::string, std::vector<int64_t>>* full_shapes = nullptr;
};

class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  // Shards/replicates `module`'s parameters in place over `mesh` (1-D),
  // broadcasting from the mesh's first rank as PyTorch's src_data_rank=0.
  // InvalidArgument for a module type the style does not support.
  virtual absl::Status Partition(torch::nn::Module& module, const DeviceMesh& mesh) const = 0;
  // input: [..., features] this rank's piece of the input in the style's
  // input layout. Returns [..., out features] this rank's piece of the output
  // in the style's output layout.
  virtual absl::StatusOr<at::Tensor> Forward(const LayerContext& layer,
                                             const at::Tensor& input) const = 0;
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

}  // namespace tpudist::fsdp

#endif  // FSDP_TENSOR_PARALLEL_H_
