#include "fsdp/parallelize_module.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "fsdp/mesh_collectives.h"
#include "nn/module_hooks.h"

namespace tpudist::fsdp {
namespace {

constexpr char kTpAttachment[] = "tpudist.fsdp.tensor_parallel";

// What a style left on the module it was applied to.
struct TpModuleState {
  std::string style;
  std::optional<DeviceMesh> mesh;  // the 1-D tp mesh
  std::vector<std::pair<std::string, TpParamPlacement>> params;  // relative names
};

const TpModuleState* StateOf(const nn::HookableModule& m) {
  return static_cast<const TpModuleState*>(m.GetAttachment(kTpAttachment).get());
}

}  // namespace

bool FqnMatches(absl::string_view pattern, absl::string_view fqn) {
  // Iterative glob with one backtrack point per '*'.
  size_t p = 0, f = 0, star = absl::string_view::npos, mark = 0;
  while (f < fqn.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = f;
    } else if (p < pattern.size() && pattern[p] == fqn[f]) {
      ++p;
      ++f;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      f = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

absl::Status ParallelizeModule(const std::shared_ptr<torch::nn::Module>& root,
                               const DeviceMesh& mesh, const ParallelizePlan& plan) {
  if (mesh.ndim() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallelism needs a 1-D mesh, got ", mesh.ToString(), "; pass mesh.Slice(\"tp\")"));
  }
  for (const auto& [pattern, style] : plan) {
    int matched = 0;
    for (auto& item : root->named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
      if (item.key().empty() != pattern.empty()) continue;  // "" only names the root
      if (!FqnMatches(pattern, item.key())) continue;
      ++matched;
      nn::HookableModule* m = nn::AsHookable(*item.value());
      if (m == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "plan key '", pattern, "' matches '", item.key(), "' (", item.value()->name(),
            "), which is not a HookableModule; hold it as nn::Linear / nn::Embedding or derive "
            "it from tpudist::nn::HookableModule"));
      }
      if (const TpModuleState* done = StateOf(*m)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "'", item.key(), "' is already parallelized with ", done->style));
      }
      auto state = std::make_shared<TpModuleState>();
      state->style = style->Name();
      state->mesh = mesh;
      absl::Status s = style->Apply(*m, mesh, &state->params);
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat("parallelizing '", item.key(), "' with ",
                                                   style->Name(), ": ", s.message()));
      }
      m->SetAttachment(kTpAttachment, std::move(state));
    }
    if (matched == 0) {
      return absl::NotFoundError(
          absl::StrCat("plan key '", pattern, "' matches no submodule of ", root->name()));
    }
  }
  return absl::OkStatus();
}

std::map<std::string, TpParamPlacement> TensorParallelPlacements(torch::nn::Module& root) {
  std::map<std::string, TpParamPlacement> out;
  for (auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const nn::HookableModule* m = nn::AsHookable(*item.value());
    const TpModuleState* state = m == nullptr ? nullptr : StateOf(*m);
    if (state == nullptr) continue;
    for (const auto& [name, where] : state->params) {
      out[item.key().empty() ? name : absl::StrCat(item.key(), ".", name)] = where;
    }
  }
  return out;
}

absl::Status AllReducePartialGrads(torch::nn::Module& root) {
  for (auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const nn::HookableModule* m = nn::AsHookable(*item.value());
    const TpModuleState* state = m == nullptr ? nullptr : StateOf(*m);
    if (state == nullptr) continue;
    auto params = item.value()->named_parameters(/*recurse=*/true);
    for (const auto& [name, where] : state->params) {
      if (!where.partial_grad) continue;
      at::Tensor* p = params.find(name);
      if (p == nullptr || !p->grad().defined()) continue;
      at::Tensor& grad = p->mutable_grad();
      absl::StatusOr<at::Tensor> sum = AllReduceAlongDim(*state->mesh, 0, grad, ReduceOp::kSum);
      if (!sum.ok()) {
        return absl::Status(sum.status().code(), absl::StrCat("AllReducePartialGrads: ", item.key(), ".", name,
                                                              ": ", sum.status().message()));
      }
      at::NoGradGuard no_grad;
      grad.copy_(*sum);
    }
  }
  return absl::OkStatus();
}

std::string TensorParallelStyleOf(const nn::HookableModule& module) {
  const TpModuleState* state = StateOf(module);
  return state == nullptr ? "" : state->style;
}

}  // namespace tpudist::fsdp
