// HookableModule: a torch::nn::Module whose forward runs registered pre- and
// post-forward hooks (libtorch C++ modules have no hooks; PyTorch's
// register_forward_pre_hook / register_forward_hook, done in C++).
//
// The rule for a module that wants hooks (e.g. to be FullyShard-ed): derive
// from HookableModule and run the whole forward body through RunForward:
//
//   class MlpImpl : public tpudist::nn::HookableModule {
//    public:
//     at::Tensor forward(const at::Tensor& x) {           // x: [B, in]
//       return RunForward(x, [&](const at::Tensor& x) {   // use the lambda's x
//         return fc2(at::relu(fc1(x)));
//       });
//     }
//   };
//
// Tensor arguments go through RunForward (a pre-hook may replace them, e.g.
// cast to bf16), the body must read the tensors it is given, and it must
// compute everything from this module's parameters inside the body.
// Non-tensor arguments are captured by the lambda. Models stay free of
// distributed code: hooks are registered from outside (fsdp/fully_shard).
//
// Hooks run in registration order. A pre-hook sees the module and the
// inputs (mutable); a post-hook sees the module, the (possibly rewritten)
// inputs and the outputs (mutable: it may replace them).
//
// Attachments: owners of hooks may hang one opaque object per key on a
// module (FullyShard keeps its per-module state there), so they can find
// each other by walking modules() without any global registry.
//
// Thread-safety: none. Register/remove hooks and attachments while no
// forward is running; forward itself follows torch::nn::Module rules.
#ifndef TPU_DIST_NN_MODULE_HOOKS_H_
#define TPU_DIST_NN_MODULE_HOOKS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

namespace tpudist::nn {

class HookableModule : public torch::nn::Module {
 public:
  // inputs: the forward's tensor arguments in order (undefined allowed).
  using PreForwardHook = std::function<void(HookableModule& module, std::vector<at::Tensor>& inputs)>;
  using PostForwardHook = std::function<void(HookableModule& module,
                                             const std::vector<at::Tensor>& inputs,
                                             std::vector<at::Tensor>& outputs)>;
  using HookId = int64_t;

  HookableModule() = default;
  explicit HookableModule(std::string name) : torch::nn::Module(std::move(name)) {}

  // Returns an id for RemoveHook. REQUIRES: hook is callable.
  HookId RegisterPreForwardHook(PreForwardHook hook);
  HookId RegisterPostForwardHook(PostForwardHook hook);
  // Removes a pre- or post-hook; false when the id is unknown.
  bool RemoveHook(HookId id);
  int num_hooks() const { return static_cast<int>(pre_.size() + post_.size()); }

  // One opaque object per key; Set replaces (nullptr erases), Get returns
  // nullptr when absent.
  void SetAttachment(const std::string& key, std::shared_ptr<void> value);
  std::shared_ptr<void> GetAttachment(const std::string& key) const;

  // Runs pre-hooks on `inputs`, body(inputs), then post-hooks on the outputs.
  // Exceptions from hooks or the body propagate (post-hooks are skipped).
  std::vector<at::Tensor> RunForwardHooks(
      std::vector<at::Tensor> inputs,
      const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>& body);

 protected:
  // The convenience forms models use. Body signatures take the (possibly
  // rewritten) tensors; the result is the (possibly rewritten) output.
  // x: [any]
  at::Tensor RunForward(const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& body);
  // x, y: [any]
  at::Tensor RunForward(const at::Tensor& x, const at::Tensor& y,
                        const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& body);

 private:
  HookId next_id_ = 1;
  std::vector<std::pair<HookId, PreForwardHook>> pre_;
  std::vector<std::pair<HookId, PostForwardHook>> post_;
  std::map<std::string, std::shared_ptr<void>> attachments_;
};

// The HookableModule inside `module`, or nullptr when it does not derive
// from HookableModule.
HookableModule* AsHookable(torch::nn::Module& module);

}  // namespace tpudist::nn

#endif  // TPU_DIST_NN_MODULE_HOOKS_H_
