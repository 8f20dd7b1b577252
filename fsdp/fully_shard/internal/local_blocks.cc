#include "fsdp/fully_shard/internal/local_blocks.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "fsdp/fully_shard/flat_param_math.h"
#include "fsdp/global_layout.h"

namespace tpudist::fsdp::internal {

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

Block UnshardedBlock(const at::Tensor& p, std::vector<int64_t>* full_shape) {
  const std::optional<GlobalLayout> layout = GetGlobalLayout(p);
  if (!layout.has_value()) {
    *full_shape = p.sizes().vec();
    return WholeBlock(*full_shape);
  }
  *full_shape = layout->full_shape;
  return Block{layout->offsets, layout->local_shape};
}

absl::StatusOr<std::vector<LocalTensor>> CollectLocalTensors(const std::shared_ptr<torch::nn::Module>& model,
                                                             int64_t rank, const StateDictOptions& options,
                                                             absl::string_view what) {
  const FsdpGroupIndex index = IndexFsdpGroups(model);
  std::vector<LocalTensor> out;
  for (const auto& item : model->named_parameters(true)) {
    const at::Tensor& p = item.value();
    if (options.ignore_frozen_params && !p.requires_grad()) continue;
    LocalTensor t{item.key(), {}, p.scalar_type(), {}, {}, p};
    auto it = index.owner.find(p.unsafeGetTensorImpl());
    if (it != index.owner.end()) {
      const FsdpParamGroup* g = it->second.first;
      if (g->state() != FsdpParamGroup::State::kSharded) {
        return absl::FailedPreconditionError(absl::StrCat(what, ": ", g->label(), " is unsharded"));
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
                              WholeBlock(b.sizes().vec()), at::Tensor()});
  }
  return out;
}

nlohmann::json DescribeLocalTensors(const std::vector<LocalTensor>& local) {
  nlohmann::json mine = nlohmann::json::array();
  for (const LocalTensor& t : local) {
    nlohmann::json d = {{"name", t.name}, {"shape", t.shape}, {"dtype", c10::toString(t.dtype)}};
    if (t.data.defined()) {
      d["offsets"] = t.block.offsets;
      d["sizes"] = t.block.sizes;
    }
    mine.push_back(std::move(d));
  }
  return mine;
}

absl::StatusOr<ShardedCheckpointMetadata> MergeBlocks(const std::vector<nlohmann::json>& all, int64_t rank,
                                                      std::vector<LocalTensor>& local, absl::string_view what) {
  ShardedCheckpointMetadata meta;
  meta.world_size = static_cast<int64_t>(all.size());
  for (int64_t r = 0; r < meta.world_size; ++r) {
    for (const auto& d : all[r]) {
      const std::string name = d["name"].get<std::string>();
      const std::vector<int64_t> shape = d["shape"].get<std::vector<int64_t>>();
      auto [it, fresh] = meta.tensors.try_emplace(name, TensorBlocks{shape, d["dtype"].get<std::string>(), {}});
      if (it->second.shape != shape) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, ": ", name, " has full shape ", c10::str(at::IntArrayRef(it->second.shape)),
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
          what, ": ", s.message(), " (is the mesh the one over every rank holding a piece, e.g. dp x tp?)"));
    }
  }
  return meta;
}

absl::StatusOr<LoadTarget> TargetOf(const FsdpGroupIndex& index, const at::Tensor& t, const std::string& name) {
  LoadTarget out;
  auto owner = index.owner.find(t.unsafeGetTensorImpl());
  if (owner != index.owner.end()) {
    absl::StatusOr<Block> b = FsdpShardBlock(*owner->second.first, owner->second.second, t, name, &out.full_shape);
    if (!b.ok()) return b.status();
    out.mine = *std::move(b);
    out.dst = owner->second.first->shard(owner->second.second);
  } else {
    out.mine = UnshardedBlock(t, &out.full_shape);
    out.dst = t;
  }
  return out;
}

at::Tensor NarrowToBlock(at::Tensor t, const Block& b) {
  for (size_t d = 0; d < b.offsets.size(); ++d) t = t.narrow(static_cast<int64_t>(d), b.offsets[d], b.sizes[d]);
  return t;
}

Block RelativeBlock(Block b, const std::vector<int64_t>& origin) {
  for (size_t d = 0; d < origin.size(); ++d) b.offsets[d] -= origin[d];
  return b;
}

}  // namespace tpudist::fsdp::internal
