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
#include "fsdp/fully_shard/flat_param_math.h"
#include "fsdp/fully_shard/mesh_agreement.h"
#include "fsdp/fully_shard/shard_blocks.h"
#include "fsdp/global_layout.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace tpudist::fsdp {
namespace {

std::string ShardPath(const std::string& dir, int64_t rank, int64_t world) {
  return absl::StrCat(dir, "/shard-", rank, "-of-", world, ".safetensors");
}

// One tensor this rank knows: its full shape and, when this rank's file
// should hold a piece, that piece and the block it is.
struct LocalTensor {
  std::string name;
  std::vector<int64_t> shape;  // full
  at::ScalarType dtype;
  at::Tensor data;             // undefined: this rank writes nothing of it
  Block block;
};

// The block of the full tensor that `p` (parameter i of `g`) holds on this
// rank: the global-layout record's block of the local tensor (fsdp/
// global_layout.h; whole when none), narrowed to this rank's torch.chunk
// rows of the local dim 0.
absl::StatusOr<Block> FsdpShardBlock(const FsdpParamGroup& g, size_t i, const at::Tensor& p,
                                     const std::string& name, std::vector<int64_t>* full_shape) {
  const FlatParamEntry& e = g.layout().entries[i];
  const std::optional<GlobalLayout> layout = GetGlobalLayout(p);
  Block b = WholeBlock(e.shape);
  *full_shape = e.shape;
  if (layout.has_value()) {
    if (layout->local_shape != e.shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sharded checkpoint: ", name, " was FullyShard-ed with shape ", c10::str(at::IntArrayRef(e.shape)),
          " but its global layout record says ", layout->ToString()));
    }
    b.offsets = layout->offsets;
    *full_shape = layout->full_shape;
  }
  const ChunkExtent rows = ShardRows(e, g.layout().world_size, g.rank());
  b.offsets[0] += rows.offset;
  b.sizes[0] = rows.size;
  return b;
}

// A parameter FullyShard does not own: its record's block, or whole.
Block UnshardedBlock(const at::Tensor& p, std::vector<int64_t>* full_shape) {
  const std::optional<GlobalLayout> layout = GetGlobalLayout(p);
  if (!layout.has_value()) {
    *full_shape = p.sizes().vec();
    return WholeBlock(*full_shape);
  }
  *full_shape = layout->full_shape;
  return Block{layout->offsets, layout->local_shape};
}

absl::StatusOr<std::vector<LocalTensor>> CollectLocal(const std::shared_ptr<torch::nn::Module>& model,
                                                      int64_t rank, const StateDictOptions& options) {
  const FsdpGroupIndex index = IndexFsdpGroups(model);
  std::vector<LocalTensor> out;
  for (const auto& item : model->named_parameters(true)) {
    const at::Tensor& p = item.value();
    if (options.ignore_frozen_params && !p.requires_grad()) continue;
    LocalTensor t{item.key(), {}, p.scalar_type(), {}, {}};
    auto it = index.owner.find(p.unsafeGetTensorImpl());
    if (it != index.owner.end()) {
      const FsdpParamGroup* g = it->second.first;
      if (g->state() != FsdpParamGroup::State::kSharded) {
        return absl::FailedPreconditionError(absl::StrCat("SaveShardedCheckpoint: ", g->label(), " is unsharded"));
      }
      absl::StatusOr<Block> b = FsdpShardBlock(*g, it->second.second, p, item.key(), &t.shape);
      if (!b.ok()) return b.status();
      t.block = *std::move(b);
      t.data = g->shard(it->second.second);
    } else {
      const bool recorded = GetGlobalLayout(p).has_value();
      t.block = UnshardedBlock(p, &t.shape);
      if (recorded || rank == 0) t.data = p.detach();
    }
    out.push_back(std::move(t));
  }
  for (const auto& item : model->named_buffers(true)) {
    const at::Tensor& b = item.value();
    out.push_back(LocalTensor{item.key(), b.sizes().vec(), b.scalar_type(), rank == 0 ? b : at::Tensor(),
                              WholeBlock(b.sizes().vec())});
  }
  return out;
}

// Merges every rank's description (in rank order) into the metadata; a
// block identical to an earlier rank's is kept once (TP replicas), and
// `local` entries of this rank that lost that way get their data dropped.
absl::StatusOr<ShardedCheckpointMetadata> MergeBlocks(const std::vector<nlohmann::json>& all, int64_t rank,
                                               std::vector<LocalTensor>& local) {
  ShardedCheckpointMetadata meta;
  meta.world_size = static_cast<int64_t>(all.size());
  for (int64_t r = 0; r < meta.world_size; ++r) {
    for (const auto& d : all[r]) {
      const std::string name = d["name"].get<std::string>();
      const std::vector<int64_t> shape = d["shape"].get<std::vector<int64_t>>();
      auto [it, fresh] = meta.tensors.try_emplace(name, TensorBlocks{shape, d["dtype"].get<std::string>(), {}});
      if (it->second.shape != shape) {
        return absl::FailedPreconditionError(absl::StrCat(
            "SaveShardedCheckpoint: ", name, " has full shape ", c10::str(at::IntArrayRef(it->second.shape)),
            " on an earlier rank but ", c10::str(at::IntArrayRef(shape)), " on rank ", r));
      }
      if (!d.contains("offsets")) continue;
      Block b{d["offsets"].get<std::vector<int64_t>>(), d["sizes"].get<std::vector<int64_t>>()};
      std::vector<SavedBlock>& blocks = it->second.blocks;
      const bool dup = std::any_of(blocks.begin(), blocks.end(), [&](const SavedBlock& s) { return s.block == b; });
      if (!dup && b.numel() > 0) {
        blocks.push_back(SavedBlock{r, std::move(b)});
      } else if (r == rank) {
        for (LocalTensor& t : local) {
          if (t.name == name) t.data = at::Tensor();
        }
      }
    }
  }
  for (const auto& [name, t] : meta.tensors) {
    absl::Status s = ValidateTensorBlocks(name, t, meta.world_size);
    if (!s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "SaveShardedCheckpoint: ", s.message(),
          " (is the mesh the one over every rank holding a piece, e.g. dp x tp?)"));
    }
  }
  return meta;
}

absl::Status WriteShards(const std::shared_ptr<torch::nn::Module>& model, const DeviceMesh& mesh,
                         const std::string& dir, const StateDictOptions& options) {
  const int64_t rank = MeshFlatRank(mesh), world = mesh.size();
  absl::StatusOr<std::vector<LocalTensor>> local = CollectLocal(model, rank, options);
  // Every rank takes part in the gather, even one that already failed.
  nlohmann::json mine = nlohmann::json::array();
  if (local.ok()) {
    for (const LocalTensor& t : *local) {
      nlohmann::json d = {{"name", t.name}, {"shape", t.shape}, {"dtype", c10::toString(t.dtype)}};
      if (t.data.defined()) {
        d["offsets"] = t.block.offsets;
        d["sizes"] = t.block.sizes;
      }
      mine.push_back(std::move(d));
    }
  }
  absl::StatusOr<std::vector<nlohmann::json>> all = AllGatherJson(mesh, mine, "SaveShardedCheckpoint: gathering block descriptions");
  if (!local.ok()) return local.status();
  if (!all.ok()) return all.status();
  absl::StatusOr<ShardedCheckpointMetadata> meta = MergeBlocks(*all, rank, *local);
  if (!meta.ok()) return meta.status();
  meta->world_size = world;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const LocalTensor& t : *local) {
    if (t.data.defined()) tensors.emplace_back(t.name, t.data);
  }
  absl::Status s = io::WriteSafetensors(ShardPath(dir, rank, world), tensors);
  if (!s.ok() || rank != 0) return s;
  return io::WriteFileAtomically(dir + "/metadata.json", ShardedCheckpointMetadataToJson(*meta).dump(1));
}

// `t` narrowed to `b` (offsets relative to t's origin). t: [any], same ndim as b.
at::Tensor Narrow(at::Tensor t, const Block& b) {
  for (size_t d = 0; d < b.offsets.size(); ++d) t = t.narrow(static_cast<int64_t>(d), b.offsets[d], b.sizes[d]);
  return t;
}

// `b` moved so that `origin` is at zero.
Block Relative(Block b, const std::vector<int64_t>& origin) {
  for (size_t d = 0; d < origin.size(); ++d) b.offsets[d] -= origin[d];
  return b;
}

}  // namespace

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
    std::vector<int64_t> full_shape;
    Block mine;
    at::Tensor dst;
    auto owner = index.owner.find(t.unsafeGetTensorImpl());
    if (owner != index.owner.end()) {
      absl::StatusOr<Block> b = FsdpShardBlock(*owner->second.first, owner->second.second, t, name, &full_shape);
      if (!b.ok()) return b.status();
      mine = *std::move(b);
      dst = owner->second.first->shard(owner->second.second);
    } else {
      mine = UnshardedBlock(t, &full_shape);
      dst = t;
    }
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
      Narrow(dst, Relative(both, mine.offsets)).copy_(Narrow(*piece, Relative(both, saved.block.offsets)));
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
