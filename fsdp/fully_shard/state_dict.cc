#include "fsdp/fully_shard/state_dict.h"

#include <exception>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/strings/str_cat.h"
#include "collectives/exception_message.h"
#include "fsdp/fully_shard/flat_buffer.h"
#include "fsdp/fully_shard/fully_shard.h"
#include "fsdp/global_layout.h"
#include "fsdp/mesh_collectives.h"
#include "fsdp/shard_math.h"

namespace tpudist::fsdp {
namespace {

absl::Status Broadcast(const DeviceMesh& mesh, at::Tensor& t, const std::string& what) {
  // From coordinate (0, ...) along each dim in turn: after dim d every rank
  // whose later coordinates are 0 holds the root's value (one dim on a 1-D
  // mesh; dp_replicate then dp_shard on an HSDP mesh).
  for (int d = 0; d < mesh.ndim(); ++d) {
    std::vector<at::Tensor> list = {t};
    c10d::BroadcastOptions opts;
    opts.asyncOp = false;  // waited on at once
    try {
      if (!mesh.Group(d)->broadcast(list, opts)->wait(mesh.collective_timeout_ms())) {
        return absl::DeadlineExceededError(absl::StrCat("SetModelStateDict: broadcast of ", what, " timed out"));
      }
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("SetModelStateDict: broadcast of ", what, " failed: ", ::tpudist::collectives::ExceptionMessage(e)));
    }
  }
  return absl::OkStatus();
}

bool Skip(const at::Tensor& p, const StateDictOptions& o) {
  return o.ignore_frozen_params && !p.requires_grad();
}

// The tensor dim along which `param` is a tensor-parallel piece (its global
// layout's local and full shapes differ there), -1 when it is whole.
// Unimplemented unless the piece is torch.chunk piece `tp_rank` of `tp`
// along exactly one dim (every TP style we have records that).
absl::StatusOr<int64_t> TpShardDim(const std::string& name, const at::Tensor& param, int64_t tp,
                                   int64_t tp_rank) {
  std::optional<GlobalLayout> g = GetGlobalLayout(param);
  if (!g || g->local_shape == g->full_shape) return -1;
  int64_t dim = -1;
  for (size_t d = 0; d < g->full_shape.size(); ++d) {
    const bool whole = g->local_shape[d] == g->full_shape[d] && g->offsets[d] == 0;
    if (whole) continue;
    const ChunkExtent want = ChunkOf(g->full_shape[d], tp, tp_rank);
    if (dim >= 0 || g->local_shape[d] != want.size || g->offsets[d] != want.offset) {
      return absl::UnimplementedError(absl::StrCat(
          "GetModelStateDict: ", name, " is the block ", g->ToString(), " on tp rank ", tp_rank, " of ", tp,
          "; only a torch.chunk piece along one dim can be gathered over tp"));
    }
    dim = static_cast<int64_t>(d);
  }
  return dim;
}

// Replaces each tensor-parallel piece in `out` (parameters of `model`, each
// already full over dp) by the full tensor, gathered over mesh dim `tp_dim`.
// Collective over that dim: every member calls with the same parameters.
absl::Status GatherTpPieces(const std::shared_ptr<torch::nn::Module>& model, const DeviceMesh& mesh,
                            int tp_dim, const StateDictOptions& options, StateDict* out) {
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    if (Skip(item.value(), options)) continue;
    absl::StatusOr<int64_t> dim = TpShardDim(item.key(), item.value(), mesh.size(tp_dim), mesh.LocalRank(tp_dim));
    if (!dim.ok()) return dim.status();
    if (*dim < 0) continue;
    at::Tensor& piece = out->at(item.key());
    absl::StatusOr<at::Tensor> full =
        AllGatherAlongDim(mesh, tp_dim, piece, *dim, GetGlobalLayout(item.value())->full_shape[*dim]);
    if (!full.ok()) {
      return absl::Status(full.status().code(),
                          absl::StrCat("GetModelStateDict: gathering ", item.key(), " over tp: ", full.status().message()));
    }
    piece = *std::move(full);
  }
  return absl::OkStatus();
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
  absl::StatusOr<int> tp_dim = TensorParallelDim(mesh);
  if (!tp_dim.ok()) return tp_dim.status();
  // With a tp dim, the dp row 0 first holds every piece full over dp.
  // With HSDP only coordinate (0, 0) keeps it (replicas are equal).
  const bool keep = !options.full_state_dict || (IsHsdpMesh(mesh) ? HoldsFullStateDict(mesh) : mesh.LocalRank(0) == 0);
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
  if (options.full_state_dict && *tp_dim > 0) {
    if (absl::Status s = GatherTpPieces(model, mesh, *tp_dim, options, &out); !s.ok()) return s;
    if (mesh.LocalRank(*tp_dim) != 0) out.clear();
  }
  return out;
}

bool IsHsdpMesh(const DeviceMesh& mesh) {
  return mesh.ndim() == 2 && mesh.dim_names() == std::vector<std::string>{"dp_replicate", "dp_shard"};
}

int FsdpShardDim(const DeviceMesh& mesh) { return IsHsdpMesh(mesh) ? 1 : 0; }

absl::StatusOr<int> TensorParallelDim(const DeviceMesh& mesh) {
  if (mesh.ndim() == 1 || IsHsdpMesh(mesh)) return 0;
  const std::vector<std::string> dp_tp = {"dp", "tp"};
  if (mesh.ndim() != 2 || mesh.dim_names() != dp_tp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state dicts take a 1-D mesh (FullyShard's), a (\"dp_replicate\", \"dp_shard\") HSDP mesh or a "
        "(\"dp\", \"tp\") mesh, not ", mesh.ToString()));
  }
  return 1;
}

bool HoldsFullStateDict(const DeviceMesh& mesh) {
  for (int d = 0; d < mesh.ndim(); ++d) {
    if (mesh.LocalRank(d) != 0) return false;
  }
  return true;
}

absl::Status SetModelStateDict(const std::shared_ptr<torch::nn::Module>& model,
                               const DeviceMesh& mesh, const StateDict& state,
                               const StateDictOptions& options) {
  const FsdpGroupIndex index = IndexFsdpGroups(model);
  const bool root_rank = HoldsFullStateDict(mesh);
  const bool full = options.full_state_dict;
  absl::StatusOr<int> tp_dim = TensorParallelDim(mesh);
  if (!tp_dim.ok()) return tp_dim.status();
  if (full && *tp_dim > 0) {
    return absl::UnimplementedError(
        "SetModelStateDict: a full state dict on a (dp, tp) mesh is not supported; load full weights before "
        "parallelizing, or load a sharded checkpoint (LoadShardedCheckpoint reads any layout)");
  }
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
    // MIN along every mesh dim in turn is MIN over the whole mesh.
    for (int d = 0; d < mesh.ndim(); ++d) {
      absl::StatusOr<at::Tensor> agreed = AllReduceAlongDim(mesh, d, verdict, ReduceOp::kMin);
      if (!agreed.ok()) return agreed.status();
      verdict = *agreed;
    }
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
