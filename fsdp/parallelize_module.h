// Applying tensor-parallel styles to a module tree.
//
// Model code holds each submodule that may be parallelized in a
// ParallelLayer and calls it like the module itself:
//
//   struct FeedForwardImpl : torch::nn::Module {
//     FeedForwardImpl(int64_t h)
//         : w1(register_module("w1", ParallelLayer(torch::nn::Linear(
//               torch::nn::LinearOptions(h, 4 * h).bias(false))))), ... {}
//     at::Tensor forward(const at::Tensor& x) { return x + w2(at::silu(w1(x))); }
//     ParallelLayer w1{nullptr}, w2{nullptr};
//   };
//
// Unparallelized, a ParallelLayer is a pass-through (same numbers, same
// parameter names: it registers the wrapped module's parameters, buffers
// and children as its own, so "w1.weight" stays "w1.weight"). The trainer
// then applies a plan, torchtitan-style, without touching model code:
//
//   ParallelizeModule(model.ptr(), tp_mesh,
//                     {{"w1", ColwiseParallel()}, {"w2", RowwiseParallel()}});
//
// This is the hook libtorch lacks: a parent's forward calls the layer it
// holds, and the layer (not the parent) owns the layout conversions. A plan
// key matching a module that is not a ParallelLayer is an error naming it.
//
// Thread-safety: parallelizing mutates the modules; do it before training,
// from one thread per rank. Forward/backward are collective over the mesh.
#ifndef FSDP_PARALLELIZE_MODULE_H_
#define FSDP_PARALLELIZE_MODULE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "fsdp/device_mesh.h"
#include "fsdp/tensor_parallel.h"

namespace tpudist::fsdp {

class ParallelLayerImpl : public torch::nn::Module {
 public:
  // `module`: a torch::nn::Linear / Embedding / any ModuleHolder or
  // shared_ptr to a module with `at::Tensor forward(const at::Tensor&)`.
  template <typename ModuleType>
  explicit ParallelLayerImpl(ModuleType module) : inner_(module) {
    Adopt();
  }

  // x: the input piece in the style's input layout (the full input when no
  // style is set). Returns the output piece in the style's output layout.
  // Throws (the torch boundary) when a collective or layout check fails.
  at::Tensor forward(const at::Tensor& x);

  // Shards the wrapped module's parameters with `style` and makes forward
  // run through it. FailedPrecondition when already parallelized.
  // REQUIRES: mesh.ndim() == 1.
  absl::Status Parallelize(std::shared_ptr<const ParallelStyle> style, const DeviceMesh& mesh);

  const ParallelStyle* style() const { return style_.get(); }
  torch::nn::AnyModule& inner() { return inner_; }
  std::shared_ptr<torch::nn::Module> inner_module() const { return inner_.ptr(); }

 private:
  void Adopt();

  torch::nn::AnyModule inner_;
  std::shared_ptr<const ParallelStyle> style_;
  std::optional<DeviceMesh> mesh_;
  std::map<std::string, std::vector<int64_t>> full_shapes_;  // before Partition
};
TORCH_MODULE(ParallelLayer);

// {submodule FQN pattern -> style}, applied in order. `*` matches any run of
// characters, dots included (Python fnmatch), so "layers.*.w1" matches
// "layers.0.w1"; "" is the root itself.
using ParallelizePlan = std::vector<std::pair<std::string, std::shared_ptr<const ParallelStyle>>>;

// Whether `fqn` matches `pattern` (pure; see ParallelizePlan).
bool FqnMatches(absl::string_view pattern, absl::string_view fqn);

// Applies `plan` to `root`'s submodules. Errors: a mesh that is not 1-D
// (pass mesh.Slice("tp")), a pattern that matches no module (NotFound), a
// match that is not a ParallelLayer or is already parallelized, or a style
// that does not support the wrapped module type. Collective: every rank of
// the mesh calls it with the same plan.
absl::Status ParallelizeModule(const std::shared_ptr<torch::nn::Module>& root,
                               const DeviceMesh& mesh, const ParallelizePlan& plan);

}  // namespace tpudist::fsdp

#endif  // FSDP_PARALLELIZE_MODULE_H_
