#include "fsdp/fully_shard/state_dict.h"

#include <exception>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/strings/str_cat.h"
#include "collectives/exception_message.h"
#include "fsdp/fully_shard/flat_buffer.h"
#include "fsdp/fully_shard/fully_shard.h"

namespace tpudist::fsdp {
namespace {

absl::Status Broadcast(const DeviceMesh& mesh, at::Tensor& t, const std::string& what) {
  std::vector<at::Tensor> list = {t};
  try {
    if (!mesh.Group(0)->broadcast(list)->wait(mesh.collective_timeout_ms())) {
      return absl::DeadlineExceededError(absl::StrCat("SetModelStateDict: broadcast of ", what, " timed out"));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("SetModelStateDict: broadcast of ", what, " failed: ", ::tpudist::collectives::ExceptionMessage(e)));
  }
  return absl::OkStatus();
}

bool Skip(const at::Tensor& p, const StateDictOptions& o) {
  return o.ignore_frozen_params && !p.requires_grad();
}

}  // namespace

FsdpGroupIndex IndexFsdpGroups(const std::shared_ptr<torch::nn::Module>& model) {
  FsdpGroupIndex index;
  for (const auto& m : model->modules(/*include_self=*/true)) {
    auto fsdp = GetFsdpModule(*m);
    if (!fsdp) continue;
    FsdpParamGroup* g = &fsdp->group();
    index.groups.push_back(g);
    for (size_t i = 0; i < g->size(); ++i) index.owner[g->param(i).unsafeGetTensorImpl()] = {g, i};
  }
  return index;
}

absl::StatusOr<StateDict> GetModelStateDict(const std::shared_ptr<torch::nn::Module>& model,
                                            const DeviceMesh& mesh, const StateDictOptions& options) {
  const FsdpGroupIndex index = IndexFsdpGroups(model);
  const bool keep = !options.full_state_dict || mesh.LocalRank(0) == 0;
  std::unordered_map<const FsdpParamGroup*, std::vector<at::Tensor>> full;
  if (options.full_state_dict) {
    for (FsdpParamGroup* g : index.groups) {
      absl::StatusOr<std::vector<at::Tensor>> f = g->GatherFullMaster();
      if (!f.ok()) return f.status();
      if (keep) full[g] = *std::move(f);
    }
  }
  StateDict out;
  if (!keep) return out;
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (Skip(p, options)) continue;
    auto it = index.owner.find(p.unsafeGetTensorImpl());
    if (it == index.owner.end()) {
      out[item.key()] = p.detach().cpu().clone();
    } else if (options.full_state_dict) {
      out[item.key()] = full[it->second.first][it->second.second];
    } else {
      out[item.key()] = it->second.first->shard(it->second.second).detach().cpu().clone();
    }
  }
  for (const auto& item : model->named_buffers(/*recurse=*/true)) {
    out[item.key()] = item.value().detach().cpu().clone();
  }
  return out;
}

absl::Status SetModelStateDict(const std::shared_ptr<torch::nn::Module>& model,
                               const DeviceMesh& mesh, const StateDict& state,
                               const StateDictOptions& options) {
  const FsdpGroupIndex index = IndexFsdpGroups(model);
  const bool root_rank = mesh.LocalRank(0) == 0;
  const bool full = options.full_state_dict;
  // Validate where the data is (rank 0 for full dicts, everywhere for
  // sharded ones), then agree on the verdict before touching anything.
  std::string error;
  const bool validates = !full || root_rank;
  auto expected_shape = [&](const at::Tensor& p) -> std::vector<int64_t> {
    auto it = index.owner.find(p.unsafeGetTensorImpl());
    if (it == index.owner.end()) return p.sizes().vec();
    const FsdpParamGroup* g = it->second.first;
    return full ? g->layout().entries[it->second.second].shape : g->shard(it->second.second).sizes().vec();
  };
  std::vector<std::pair<std::string, at::Tensor>> targets;
  for (const auto& item : model->named_parameters(true)) {
    if (!Skip(item.value(), options)) targets.emplace_back(item.key(), item.value());
  }
  for (const auto& item : model->named_buffers(true)) targets.emplace_back(item.key(), item.value());
  if (validates) {
    for (const auto& [name, t] : targets) {
      auto it = state.find(name);
      if (it == state.end()) {
        error = absl::StrCat("SetModelStateDict: missing key ", name);
        break;
      }
      if (it->second.sizes().vec() != expected_shape(t)) {
        error = absl::StrCat("SetModelStateDict: ", name, " has shape ", c10::str(it->second.sizes()),
                             ", expected ", c10::str(at::IntArrayRef(expected_shape(t))));
        break;
      }
    }
  }
  at::Tensor verdict = at::full({1}, error.empty() ? 1 : 0, at::kInt);
  if (full) {
    absl::Status s = Broadcast(mesh, verdict, "the verdict");
    if (!s.ok()) return s;
  } else {
    std::vector<at::Tensor> v = {verdict};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MIN;
    mesh.Group(0)->allreduce(v, o)->wait(mesh.collective_timeout_ms());
  }
  if (verdict.item<int>() == 0) {
    return absl::InvalidArgumentError(error.empty() ? "SetModelStateDict: rejected on another rank" : error);
  }
  at::NoGradGuard no_grad;
  // Sharded parameters, group by group (one broadcast each for full dicts).
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const auto& [name, t] : targets) names[t.unsafeGetTensorImpl()] = name;
  for (FsdpParamGroup* g : index.groups) {
    std::vector<at::Tensor> fulls(g->size());
    if (full) {
      for (size_t i = 0; i < g->size(); ++i) {
        auto n = names.find(g->param(i).unsafeGetTensorImpl());
        fulls[i] = n != names.end() && root_rank ? state.at(n->second).to(g->shard(i).scalar_type())
                                                 : at::Tensor();
      }
      at::Tensor packed = root_rank ? PackReduceScatterInput(fulls, g->layout(), g->shard(0).scalar_type())
                                    : at::empty({g->layout().world_size * g->layout().shard_numel},
                                                g->shard(0).options());
      absl::Status s = Broadcast(mesh, packed, g->label());
      if (!s.ok()) return s;
      const at::Tensor mine = packed.view({g->layout().world_size, -1})[g->rank()];
      for (size_t i = 0; i < g->size(); ++i) {
        if (names.count(g->param(i).unsafeGetTensorImpl())) g->shard(i).copy_(ShardView(mine, g->layout(), i, g->rank()));
      }
    } else {
      for (size_t i = 0; i < g->size(); ++i) {
        auto n = names.find(g->param(i).unsafeGetTensorImpl());
        if (n != names.end()) g->shard(i).copy_(state.at(n->second));
      }
    }
  }
  // Everything else as is (broadcast from rank 0 for full dicts).
  for (auto& [name, t] : targets) {
    if (index.owner.count(t.unsafeGetTensorImpl())) continue;
    at::Tensor value = validates ? state.at(name).to(t.scalar_type()).clone() : at::empty_like(t);
    if (full) {
      absl::Status s = Broadcast(mesh, value, name);
      if (!s.ok()) return s;
    }
    t.copy_(value);
  }
  return absl::OkStatus();
}

}  // namespace tpudist::fsdp
