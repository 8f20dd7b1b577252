#include "fsdp/fully_shard/fully_shard.h"

#include <algorithm>
#include <unordered_set>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include "absl/strings/str_cat.h"

namespace tpudist::fsdp {

constexpr char kAttachmentKey[] = "tpudist.fsdp.state";

// Marks a parameter as owned by a group; a pass-through gradient hook that
// lives in the parameter's autograd meta (it survives set_data).
class OwnerTag : public torch::autograd::FunctionPreHook {
 public:
  explicit OwnerTag(std::string owner) : owner_(std::move(owner)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    return grads;
  }
  const std::string& owner() const { return owner_; }

 private:
  std::string owner_;
};

// Shared by the root and every FullyShard module under it.
struct RootContext {
  std::vector<FsdpState*> states;                  // pre-order, root first
  std::vector<FsdpState*> forward_order;           // this iteration, pre-forward order
  std::vector<FsdpState*> prev_forward_order;      // last iteration's
  std::vector<FsdpState*> post_forward_order;      // this iteration, post-forward order
  bool in_backward = false;
  FsdpStats stats;
};

class FsdpState : public std::enable_shared_from_this<FsdpState> {
 public:
  FsdpState(torch::nn::Module* module, std::shared_ptr<FsdpParamGroup> group, FullyShardOptions options)
      : module_(module), group_(std::move(group)), options_(std::move(options)) {
    options_.ignored_params.clear();
  }

  FsdpParamGroup& group() { return *group_; }
  torch::nn::Module& module() { return *module_; }
  const std::shared_ptr<RootContext>& ctx() const { return ctx_; }
  FullyShardOptions& options() { return options_; }

  void InstallHooks(nn::HookableModule& m) {
    std::weak_ptr<FsdpState> weak = weak_from_this();
    m.RegisterPreForwardHook([weak](nn::HookableModule&, std::vector<at::Tensor>& in) {
      if (auto s = weak.lock()) s->PreForward(in);
    });
    m.RegisterPostForwardHook([weak](nn::HookableModule&, const std::vector<at::Tensor>&,
                                     std::vector<at::Tensor>& out) {
      if (auto s = weak.lock()) s->PostForward(out);
    });
  }

  std::vector<std::shared_ptr<FsdpState>> Subtree() {
    std::vector<std::shared_ptr<FsdpState>> out = {shared_from_this()};
    for (const auto& m : module_->modules(/*include_self=*/false)) {
      if (auto* h = nn::AsHookable(*m)) {
        if (auto s = h->GetAttachment(kAttachmentKey)) out.push_back(std::static_pointer_cast<FsdpState>(s));
      }
    }
    return out;
  }

  FsdpStats& stats() {
    TORCH_CHECK(ctx_ != nullptr, "FullyShard: stats() before the first forward");
    return ctx_->stats;
  }

  bool reshard_after_forward() const {
    return options_.reshard_after_forward.value_or(!is_root_);
  }

 private:
  static void Check(const absl::Status& s) { TORCH_CHECK(s.ok(), s.ToString()); }

  void Trace(const std::string& event) {
    if (ctx_ && ctx_->stats.tracing) ctx_->stats.trace.push_back(group_->label() + ":" + event);
  }

  void LazyInitAsRoot() {
    auto ctx = std::make_shared<RootContext>();
    std::weak_ptr<RootContext> weak_ctx = ctx;
    for (const auto& s : Subtree()) {
      s->ctx_ = ctx;
      s->is_root_ = false;
      ctx->states.push_back(s.get());
      s->group_->set_memory_observer([weak_ctx](int64_t delta) {
        if (auto c = weak_ctx.lock()) {
          c->stats.live_unsharded_bytes += delta;
          c->stats.peak_unsharded_bytes =
              std::max(c->stats.peak_unsharded_bytes, c->stats.live_unsharded_bytes);
        }
      });
      s->group_->set_trace([weak_ctx](const std::string& e) {
        if (auto c = weak_ctx.lock(); c && c->stats.tracing) c->stats.trace.push_back(e);
      });
      s->group_->set_phase_timer(
          [weak_ctx] {
            auto c = weak_ctx.lock();
            return c != nullptr && c->stats.timing;
          },
          [weak_ctx](const char* phase, double wall_s, double cpu_s) {
            if (auto c = weak_ctx.lock()) {
              FsdpPhaseTime& t = c->stats.phase_times[phase];
              t.wall_s += wall_s;
              t.cpu_s += cpu_s;
              ++t.calls;
            }
          });
    }
    is_root_ = true;
  }

  void PreForward(std::vector<at::Tensor>& inputs) {
    if (ctx_ == nullptr) LazyInitAsRoot();
    if (is_root_) {
      TORCH_CHECK(!ctx_->in_backward, "FullyShard(", group_->label(), "): forward during backward");
      if (!ctx_->forward_order.empty()) ctx_->prev_forward_order = ctx_->forward_order;
      ctx_->forward_order.clear();
      ctx_->post_forward_order.clear();
    }
    ctx_->forward_order.push_back(this);
    Check(group_->WaitUnshard());
    const size_t k = ctx_->forward_order.size() - 1;
    const auto& prev = ctx_->prev_forward_order;
    if (options_.prefetch && k + 1 < prev.size() && prev[k] == this) {
      Check(prev[k + 1]->group_->StartUnshard());
    }
    if (options_.mp_policy.param_dtype && options_.mp_policy.cast_forward_inputs) {
      const at::ScalarType dt = *options_.mp_policy.param_dtype;
      for (at::Tensor& t : inputs) {
        if (t.defined() && at::isFloatingType(t.scalar_type()) && t.scalar_type() != dt) t = t.to(dt);
      }
    }
    Trace("forward");
  }

  void PostForward(std::vector<at::Tensor>& outputs) {
    ctx_->post_forward_order.push_back(this);
    if (reshard_after_forward()) Check(group_->Reshard());
    bool any_grad = false;
    if (torch::autograd::GradMode::is_enabled()) {
      std::weak_ptr<FsdpState> weak = weak_from_this();
      for (at::Tensor& out : outputs) {
        if (!out.defined() || !out.requires_grad()) continue;
        any_grad = true;
        out.register_hook([weak](const at::TensorBase&) {
          if (auto s = weak.lock()) s->PreBackward();
        });
      }
    }
    if (is_root_ && !any_grad) {  // no backward will come: free everything now
      for (FsdpState* s : ctx_->states) Check(s->group_->Reshard());
    }
  }

  void PreBackward() {
    if (!ctx_->in_backward) {
      ctx_->in_backward = true;
      std::weak_ptr<RootContext> weak_ctx = ctx_;
      torch::autograd::Engine::get_default_engine().queue_callback([weak_ctx] {
        if (auto c = weak_ctx.lock()) FinishBackward(*c);
      });
    }
    if (group_->backward_started()) return;
    group_->BeginBackward();
    Check(group_->WaitUnshard());
    Trace("backward");
    const auto& order = ctx_->post_forward_order;
    auto it = std::find(order.begin(), order.end(), this);
    if (options_.prefetch && it != order.end() && it != order.begin()) {
      FsdpState* next = *(it - 1);
      if (!next->group_->backward_started()) Check(next->group_->StartUnshard());
    }
  }

  static void FinishBackward(RootContext& ctx) {
    for (FsdpState* s : ctx.states) {
      if (s->group_->backward_started() && !s->group_->grads_reduced()) {
        Check(s->group_->ReduceGrads());  // some params got no grad: zeros
      }
    }
    for (FsdpState* s : ctx.states) Check(s->group_->FinishReduceGrads());
    for (FsdpState* s : ctx.states) {
      Check(s->group_->Reshard());
      s->group_->EndBackward();
    }
    ctx.in_backward = false;
    if (ctx.stats.tracing) ctx.stats.trace.push_back("backward_done");
  }

  torch::nn::Module* module_;  // owns this state (attachment)
  std::shared_ptr<FsdpParamGroup> group_;
  FullyShardOptions options_;
  std::shared_ptr<RootContext> ctx_;
  bool is_root_ = false;
};

namespace {

const OwnerTag* FindTag(const at::Tensor& p) {
  if (!p.defined() || torch::autograd::impl::get_autograd_meta(p) == nullptr) return nullptr;
  for (const auto& h : torch::autograd::impl::hooks(p)) {
    if (auto* tag = dynamic_cast<const OwnerTag*>(h.get())) return tag;
  }
  return nullptr;
}

}  // namespace

FsdpParamGroup& FsdpModule::group() const { return state_->group(); }

std::vector<FsdpModule> FsdpModule::Subtree() const {
  std::vector<FsdpModule> out;
  for (auto& s : state_->Subtree()) out.emplace_back(s);
  return out;
}

void FsdpModule::SetRequiresGradientSync(bool sync) const {
  for (auto& s : state_->Subtree()) s->group().set_requires_gradient_sync(sync);
}

void FsdpModule::SetReshardAfterForward(bool reshard) const {
  state_->options().reshard_after_forward = reshard;
}

absl::Status FsdpModule::Unshard() const { return state_->group().WaitUnshard(); }
absl::Status FsdpModule::Reshard() const { return state_->group().Reshard(); }
FsdpStats& FsdpModule::stats() const { return state_->stats(); }

absl::StatusOr<std::vector<std::pair<std::string, DTensor>>> FsdpModule::ShardedParameters() const {
  std::vector<std::pair<std::string, DTensor>> out;
  FsdpParamGroup& g = state_->group();
  for (size_t i = 0; i < g.size(); ++i) {
    absl::StatusOr<DTensor> d = g.ShardedParam(i);
    if (!d.ok()) return d.status();
    out.emplace_back(g.name(i), *std::move(d));
  }
  return out;
}

std::optional<FsdpModule> GetFsdpModule(torch::nn::Module& module) {
  auto* h = nn::AsHookable(module);
  if (h == nullptr) return std::nullopt;
  auto s = h->GetAttachment(kAttachmentKey);
  if (s == nullptr) return std::nullopt;
  return FsdpModule(std::static_pointer_cast<FsdpState>(s));
}

std::optional<std::string> FsdpOwner(const at::Tensor& param) {
  const OwnerTag* tag = FindTag(param);
  if (tag == nullptr) return std::nullopt;
  return tag->owner();
}

absl::StatusOr<FsdpModule> FullyShard(const std::shared_ptr<torch::nn::Module>& module,
                                      const DeviceMesh& mesh, const FullyShardOptions& options) {
  if (module == nullptr) return absl::InvalidArgumentError("FullyShard: null module");
  nn::HookableModule* hookable = nn::AsHookable(*module);
  const std::string label = options.label.empty() ? module->name() : options.label;
  if (hookable == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FullyShard(", label, "): the module must derive from tpudist::nn::HookableModule and "
        "run its forward through RunForward (see nn/module_hooks.h)"));
  }
  if (hookable->GetAttachment(kAttachmentKey) != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("FullyShard(", label, "): already applied"));
  }
  // Parameters owned by FullyShard modules inside this one are theirs.
  std::unordered_set<const c10::TensorImpl*> inner, ignored, taken;
  for (const auto& m : module->modules(/*include_self=*/false)) {
    if (auto inner_module = GetFsdpModule(*m)) {
      FsdpParamGroup& g = inner_module->group();
      for (size_t i = 0; i < g.size(); ++i) inner.insert(g.param(i).unsafeGetTensorImpl());
    }
  }
  for (const at::Tensor& p : options.ignored_params) ignored.insert(p.unsafeGetTensorImpl());
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& item : module->named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    const c10::TensorImpl* impl = p.unsafeGetTensorImpl();
    if (ignored.count(impl) || inner.count(impl) || taken.count(impl)) continue;
    if (auto owner = FsdpOwner(p)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FullyShard(", label, "): parameter ", item.key(), " is shared with FullyShard group '",
          *owner, "', which is not inside this module; a parameter may belong to one group only "
          "(apply FullyShard to a common ancestor instead)"));
    }
    taken.insert(impl);
    params.emplace_back(item.key(), p);
  }
  absl::StatusOr<std::shared_ptr<FsdpParamGroup>> group =
      FsdpParamGroup::Create(label, std::move(params), mesh, options.mp_policy);
  if (!group.ok()) return group.status();
  for (size_t i = 0; i < (*group)->size(); ++i) {
    torch::autograd::impl::add_hook((*group)->param(i), std::make_unique<OwnerTag>(label));
  }
  auto state = std::make_shared<FsdpState>(module.get(), *std::move(group), options);
  state->InstallHooks(*hookable);
  hookable->SetAttachment(kAttachmentKey, state);
  return FsdpModule(state);
}

}  // namespace tpudist::fsdp
