#include "nn/module_hooks.h"

#include <algorithm>

#include <c10/util/Exception.h>

namespace tpudist::nn {

HookableModule::HookId HookableModule::RegisterPreForwardHook(PreForwardHook hook) {
  TORCH_CHECK(hook, "RegisterPreForwardHook: empty hook");
  pre_.emplace_back(next_id_, std::move(hook));
  return next_id_++;
}

HookableModule::HookId HookableModule::RegisterPostForwardHook(PostForwardHook hook) {
  TORCH_CHECK(hook, "RegisterPostForwardHook: empty hook");
  post_.emplace_back(next_id_, std::move(hook));
  return next_id_++;
}

bool HookableModule::RemoveHook(HookId id) {
  auto drop = [id](auto& list) {
    auto it = std::find_if(list.begin(), list.end(), [id](const auto& e) { return e.first == id; });
    if (it == list.end()) return false;
    list.erase(it);
    return true;
  };
  return drop(pre_) || drop(post_);
}

void HookableModule::SetAttachment(const std::string& key, std::shared_ptr<void> value) {
  if (value == nullptr) {
    attachments_.erase(key);
  } else {
    attachments_[key] = std::move(value);
  }
}

std::shared_ptr<void> HookableModule::GetAttachment(const std::string& key) const {
  auto it = attachments_.find(key);
  return it == attachments_.end() ? nullptr : it->second;
}

std::vector<at::Tensor> HookableModule::RunForwardHooks(
    std::vector<at::Tensor> inputs,
    const std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>& body) {
  // Copy the lists: a hook may register or remove hooks.
  const auto pre = pre_;
  for (const auto& [id, hook] : pre) hook(*this, inputs);
  std::vector<at::Tensor> outputs = body(inputs);
  const auto post = post_;
  for (const auto& [id, hook] : post) hook(*this, inputs, outputs);
  return outputs;
}

at::Tensor HookableModule::RunForward(const at::Tensor& x,
                                      const std::function<at::Tensor(const at::Tensor&)>& body) {
  std::vector<at::Tensor> out = RunForwardHooks(
      {x}, [&](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{body(in[0])}; });
  TORCH_CHECK(out.size() == 1, "RunForward: a post-forward hook changed the output count");
  return out[0];
}

at::Tensor HookableModule::RunForward(
    const at::Tensor& x, const at::Tensor& y,
    const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& body) {
  std::vector<at::Tensor> out = RunForwardHooks({x, y}, [&](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{body(in[0], in[1])};
  });
  TORCH_CHECK(out.size() == 1, "RunForward: a post-forward hook changed the output count");
  return out[0];
}

HookableModule* AsHookable(torch::nn::Module& module) {
  return dynamic_cast<HookableModule*>(&module);
}

}  // namespace tpudist::nn
