#include "fsdp/fully_shard/sharded_checkpoint.h"

#include <fstream>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/strings/str_cat.h"
#include "collectives/exception_message.h"
#include "fsdp/fully_shard/flat_param_math.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace tpudist::fsdp {
namespace {

std::string ShardPath(const std::string& dir, int64_t rank, int64_t world) {
  return absl::StrCat(dir, "/shard-", rank, "-of-", world, ".safetensors");
}

// All-reduce MIN of ok-ness: every rank learns whether all succeeded.
absl::Status AgreeOk(const DeviceMesh& mesh, const absl::Status& mine, const char* what) {
  std::vector<at::Tensor> v = {at::full({1}, mine.ok() ? 1 : 0, at::kInt)};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MIN;
  try {
    if (!mesh.Group(0)->allreduce(v, o)->wait(mesh.collective_timeout_ms())) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": barrier timed out"));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": barrier failed: ", ::tpudist::collectives::ExceptionMessage(e)));
  }
  if (!mine.ok()) return mine;
  if (v[0].item<int>() == 0) return absl::AbortedError(absl::StrCat(what, ": failed on another rank"));
  return absl::OkStatus();
}

absl::Status WriteShards(const std::shared_ptr<torch::nn::Module>& model, const DeviceMesh& mesh,
                         const std::string& dir, const StateDictOptions& options) {
  const FsdpGroupIndex index = IndexFsdpGroups(model);
  const int64_t rank = mesh.LocalRank(0), world = mesh.size();
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  nlohmann::json meta = {{"world_size", world}, {"tensors", nlohmann::json::object()}};
  auto describe = [&](const std::string& name, const std::vector<int64_t>& shape, at::ScalarType t,
                      bool sharded) {
    meta["tensors"][name] = {{"shape", shape}, {"dtype", c10::toString(t)}, {"sharded", sharded}};
  };
  for (const auto& item : model->named_parameters(true)) {
    const at::Tensor& p = item.value();
    if (options.ignore_frozen_params && !p.requires_grad()) continue;
    auto it = index.owner.find(p.unsafeGetTensorImpl());
    if (it != index.owner.end()) {
      const FsdpParamGroup* g = it->second.first;
      if (g->state() != FsdpParamGroup::State::kSharded) {
        return absl::FailedPreconditionError(absl::StrCat("SaveShardedCheckpoint: ", g->label(), " is unsharded"));
      }
      tensors.emplace_back(item.key(), g->shard(it->second.second));
      describe(item.key(), g->layout().entries[it->second.second].shape, p.scalar_type(), true);
    } else {
      if (rank == 0) tensors.emplace_back(item.key(), p.detach());
      describe(item.key(), p.sizes().vec(), p.scalar_type(), false);
    }
  }
  for (const auto& item : model->named_buffers(true)) {
    if (rank == 0) tensors.emplace_back(item.key(), item.value());
    describe(item.key(), item.value().sizes().vec(), item.value().scalar_type(), false);
  }
  absl::Status s = io::WriteSafetensors(ShardPath(dir, rank, world), tensors);
  if (!s.ok() || rank != 0) return s;
  return io::WriteFileAtomically(dir + "/metadata.json", meta.dump(1));
}

}  // namespace

absl::Status SaveShardedCheckpoint(const std::shared_ptr<torch::nn::Module>& model,
                                   const DeviceMesh& mesh, const std::string& dir,
                                   const StateDictOptions& options) {
  return AgreeOk(mesh, WriteShards(model, mesh, dir, options), "SaveShardedCheckpoint");
}

absl::Status LoadShardedCheckpoint(const std::shared_ptr<torch::nn::Module>& model,
                                   const DeviceMesh& mesh, const std::string& dir) {
  std::ifstream in(dir + "/metadata.json");
  if (!in) return absl::NotFoundError(absl::StrCat("LoadShardedCheckpoint: no ", dir, "/metadata.json"));
  nlohmann::json meta = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.contains("world_size") || !meta.contains("tensors")) {
    return absl::DataLossError(absl::StrCat("LoadShardedCheckpoint: malformed ", dir, "/metadata.json"));
  }
  const int64_t old_world = meta["world_size"].get<int64_t>();
  std::map<int64_t, io::SafetensorsContents> files;  // old rank -> contents, read on demand
  auto file = [&](int64_t r) -> absl::StatusOr<const io::SafetensorsContents*> {
    auto it = files.find(r);
    if (it == files.end()) {
      absl::StatusOr<io::SafetensorsContents> c = io::ReadSafetensors(ShardPath(dir, r, old_world));
      if (!c.ok()) return c.status();
      it = files.emplace(r, *std::move(c)).first;
    }
    return &it->second;
  };
  auto get = [&](int64_t r, const std::string& name) -> absl::StatusOr<at::Tensor> {
    absl::StatusOr<const io::SafetensorsContents*> c = file(r);
    if (!c.ok()) return c.status();
    auto it = (*c)->tensors.find(name);
    if (it == (*c)->tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat("LoadShardedCheckpoint: ", ShardPath(dir, r, old_world),
                                                     " lacks ", name));
    }
    return it->second;
  };
  const FsdpGroupIndex index = IndexFsdpGroups(model);
  at::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> targets;
  for (const auto& item : model->named_parameters(true)) targets.emplace_back(item.key(), item.value());
  for (const auto& item : model->named_buffers(true)) targets.emplace_back(item.key(), item.value());
  for (auto& [name, t] : targets) {
    if (!meta["tensors"].contains(name)) continue;  // skipped on save (frozen)
    const auto& m = meta["tensors"][name];
    const std::vector<int64_t> shape = m["shape"].get<std::vector<int64_t>>();
    auto owner = index.owner.find(t.unsafeGetTensorImpl());
    if (owner == index.owner.end()) {
      absl::StatusOr<at::Tensor> v = get(0, name);
      if (!v.ok()) return v.status();
      if (v->sizes() != t.sizes()) {
        return absl::InvalidArgumentError(absl::StrCat("LoadShardedCheckpoint: ", name, " has shape ",
                                                       c10::str(v->sizes()), ", the model has ", c10::str(t.sizes())));
      }
      t.copy_(*v);
      continue;
    }
    const FsdpParamGroup* g = owner->second.first;
    const size_t i = owner->second.second;
    const FlatParamEntry& e = g->layout().entries[i];
    if (shape != e.shape || !m["sharded"].get<bool>()) {
      return absl::InvalidArgumentError(absl::StrCat("LoadShardedCheckpoint: ", name, " has shape ",
                                                     c10::str(at::IntArrayRef(shape)), ", the model has ",
                                                     c10::str(at::IntArrayRef(e.shape))));
    }
    const ChunkExtent mine = ShardRows(e, g->layout().world_size, g->rank());
    const RowRange want{mine.offset, mine.offset + mine.size};
    at::Tensor dst = g->shard(i);
    for (int64_t r = 0; r < old_world && want.size() > 0; ++r) {
      const ChunkExtent theirs = ChunkOf(shape[0], old_world, r);
      const RowRange have{theirs.offset, theirs.offset + theirs.size};
      const RowRange both = Intersect(want, have);
      if (both.size() == 0) continue;
      absl::StatusOr<at::Tensor> piece = get(r, name);
      if (!piece.ok()) return piece.status();
      dst.narrow(0, both.begin - want.begin, both.size())
          .copy_(piece->narrow(0, both.begin - have.begin, both.size()));
    }
  }
  return absl::OkStatus();
}

absl::Status SaveFullSafetensors(const std::shared_ptr<torch::nn::Module>& model,
                                 const DeviceMesh& mesh, const std::string& path,
                                 const StateDictOptions& options) {
  StateDictOptions o = options;
  o.full_state_dict = true;
  absl::StatusOr<StateDict> sd = GetModelStateDict(model, mesh, o);
  absl::Status s = sd.status();
  if (s.ok() && mesh.LocalRank(0) == 0) {
    std::vector<std::pair<std::string, at::Tensor>> list(sd->begin(), sd->end());
    s = io::WriteSafetensors(path, list, {{"format", "pt"}});
  }
  return AgreeOk(mesh, s, "SaveFullSafetensors");
}

}  // namespace tpudist::fsdp
