#include "fsdp/fully_shard/sharded_checkpoint.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "fsdp/fully_shard/internal/local_blocks.h"
#include "fsdp/fully_shard/mesh_agreement.h"
#include "fsdp/fully_shard/shard_blocks.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace tpudist::fsdp {
namespace {

std::string ShardPath(const std::string& dir, int64_t rank, int64_t world) {
  return absl::StrCat(dir, "/shard-", rank, "-of-", world, ".safetensors");
}

using internal::LocalTensor;

absl::StatusOr<ShardedCheckpointParts> CollectParts(const std::shared_ptr<torch::nn::Module>& model,
                                                    const DeviceMesh& mesh, const StateDictOptions& options) {
  const int64_t rank = MeshFlatRank(mesh), world = mesh.size();
  absl::StatusOr<std::vector<LocalTensor>> local =
      internal::CollectLocalTensors(model, rank, options, "SaveShardedCheckpoint");
  // Every rank takes part in the gather, even one that already failed.
  const nlohmann::json mine = local.ok() ? internal::DescribeLocalTensors(*local) : nlohmann::json::array();
  absl::StatusOr<std::vector<nlohmann::json>> all = AllGatherJson(mesh, mine, "SaveShardedCheckpoint: gathering block descriptions");
  if (!local.ok()) return local.status();
  if (!all.ok()) return all.status();
  absl::StatusOr<ShardedCheckpointMetadata> meta = internal::MergeBlocks(*all, rank, *local, "SaveShardedCheckpoint");
  if (!meta.ok()) return meta.status();
  meta->world_size = world;
  ShardedCheckpointParts parts;
  parts.rank = rank;
  parts.world_size = world;
  for (const LocalTensor& t : *local) {
    if (t.data.defined()) parts.tensors.emplace_back(t.name, t.data);
  }
  if (rank == 0) parts.metadata_json = ShardedCheckpointMetadataToJson(*meta).dump(1);
  return parts;
}

absl::Status WriteShards(const std::shared_ptr<torch::nn::Module>& model, const DeviceMesh& mesh,
                         const std::string& dir, const StateDictOptions& options) {
  absl::StatusOr<ShardedCheckpointParts> parts = CollectParts(model, mesh, options);
  if (!parts.ok()) return parts.status();
  return WriteShardedParts(*parts, dir);
}

}  // namespace

absl::StatusOr<ShardedCheckpointParts> CollectShardedCheckpoint(const std::shared_ptr<torch::nn::Module>& model,
                                                               const DeviceMesh& mesh,
                                                               const StateDictOptions& options) {
  absl::StatusOr<ShardedCheckpointParts> parts = CollectParts(model, mesh, options);
  if (absl::Status s = AgreeOnStatus(mesh, parts.status(), "CollectShardedCheckpoint"); !s.ok()) return s;
  return parts;
}

absl::Status WriteShardedParts(const ShardedCheckpointParts& parts, const std::string& dir) {
  absl::Status s = io::WriteSafetensors(ShardPath(dir, parts.rank, parts.world_size), parts.tensors);
  if (!s.ok() || parts.rank != 0) return s;
  return io::WriteFileAtomically(dir + "/metadata.json", parts.metadata_json);
}

absl::Status SaveShardedCheckpoint(const std::shared_ptr<torch::nn::Module>& model,
                                   const DeviceMesh& mesh, const std::string& dir,
                                   const StateDictOptions& options) {
  return AgreeOnStatus(mesh, WriteShards(model, mesh, dir, options), "SaveShardedCheckpoint");
}

absl::Status LoadShardedCheckpoint(const std::shared_ptr<torch::nn::Module>& model,
                                   const DeviceMesh& mesh, const std::string& dir) {
  (void)mesh;  // no communication: each rank reads what it needs
  const std::string meta_path = dir + "/metadata.json";
  std::ifstream in(meta_path);
  if (!in) return absl::NotFoundError(absl::StrCat("LoadShardedCheckpoint: no ", meta_path));
  nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::DataLossError(absl::StrCat("LoadShardedCheckpoint: malformed ", meta_path));
  absl::StatusOr<ShardedCheckpointMetadata> meta = ParseShardedCheckpointMetadata(json, meta_path);
  if (!meta.ok()) {
    return absl::Status(meta.status().code(), absl::StrCat("LoadShardedCheckpoint: ", meta.status().message()));
  }
  const int64_t old_world = meta->world_size;
  std::map<int64_t, io::SafetensorsContents> files;  // old rank -> contents, read on demand
  auto get = [&](int64_t r, const std::string& name) -> absl::StatusOr<at::Tensor> {
    auto it = files.find(r);
    if (it == files.end()) {
      absl::StatusOr<io::SafetensorsContents> c = io::ReadSafetensors(ShardPath(dir, r, old_world));
      if (!c.ok()) return c.status();
      it = files.emplace(r, *std::move(c)).first;
    }
    auto t = it->second.tensors.find(name);
    if (t == it->second.tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat("LoadShardedCheckpoint: ", ShardPath(dir, r, old_world),
                                                     " lacks ", name));
    }
    return t->second;
  };
  const FsdpGroupIndex index = IndexFsdpGroups(model);
  at::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> targets;
  for (const auto& item : model->named_parameters(true)) targets.emplace_back(item.key(), item.value());
  for (const auto& item : model->named_buffers(true)) targets.emplace_back(item.key(), item.value());
  for (auto& [name, t] : targets) {
    auto m = meta->tensors.find(name);
    if (m == meta->tensors.end()) continue;  // skipped on save (frozen)
    absl::StatusOr<internal::LoadTarget> target = internal::TargetOf(index, t, name);
    if (!target.ok()) return target.status();
    const auto& [mine, full_shape, dst] = *target;
    if (m->second.shape != full_shape) {
      return absl::InvalidArgumentError(absl::StrCat("LoadShardedCheckpoint: ", name, " has shape ",
                                                     c10::str(at::IntArrayRef(m->second.shape)), " in ", meta_path,
                                                     ", the model has ", c10::str(at::IntArrayRef(full_shape))));
    }
    for (const SavedBlock& saved : m->second.blocks) {
      const Block both = IntersectBlocks(mine, saved.block);
      if (both.numel() == 0) continue;
      absl::StatusOr<at::Tensor> piece = get(saved.rank, name);
      if (!piece.ok()) return piece.status();
      if (piece->sizes() != at::IntArrayRef(saved.block.sizes)) {
        return absl::DataLossError(absl::StrCat("LoadShardedCheckpoint: ", ShardPath(dir, saved.rank, old_world),
                                                " holds ", name, " of shape ", c10::str(piece->sizes()), " but ",
                                                meta_path, " says ", saved.block.ToString()));
      }
      internal::NarrowToBlock(dst, internal::RelativeBlock(both, mine.offsets))
          .copy_(internal::NarrowToBlock(*piece, internal::RelativeBlock(both, saved.block.offsets)));
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
  if (s.ok() && HoldsFullStateDict(mesh)) {
    std::vector<std::pair<std::string, at::Tensor>> list(sd->begin(), sd->end());
    s = io::WriteSafetensors(path, list, {{"format", "pt"}});
  }
  return AgreeOnStatus(mesh, s, "SaveFullSafetensors");
}

}  // namespace tpudist::fsdp
