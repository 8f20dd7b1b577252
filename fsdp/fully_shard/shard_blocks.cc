#include "fsdp/fully_shard/shard_blocks.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fsdp/shard_math.h"

namespace tpudist::fsdp {
namespace {

// `j[key]` as a list of integers; false when absent or of another type.
bool IntList(const nlohmann::json& j, const char* key, std::vector<int64_t>* out) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_array()) return false;
  out->clear();
  for (const auto& v : j[key]) {
    if (!v.is_number_integer()) return false;
    out->push_back(v.get<int64_t>());
  }
  return true;
}

std::string Dims(const std::vector<int64_t>& v) { return absl::StrCat("[", absl::StrJoin(v, ", "), "]"); }

// Format 1: torch.chunk rows of dim 0 per rank, or whole in rank 0's file.
std::vector<SavedBlock> Format1Blocks(const std::vector<int64_t>& shape, bool sharded, int64_t world) {
  if (!sharded || shape.empty()) return {SavedBlock{0, WholeBlock(shape)}};
  std::vector<SavedBlock> blocks;
  for (int64_t r = 0; r < world; ++r) {
    const ChunkExtent rows = ChunkOf(shape[0], world, r);
    Block b = WholeBlock(shape);
    b.offsets[0] = rows.offset;
    b.sizes[0] = rows.size;
    blocks.push_back(SavedBlock{r, std::move(b)});
  }
  return blocks;
}

}  // namespace

int64_t Block::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::string Block::ToString() const { return absl::StrCat("offsets ", Dims(offsets), " sizes ", Dims(sizes)); }

Block WholeBlock(const std::vector<int64_t>& shape) {
  return Block{std::vector<int64_t>(shape.size(), 0), shape};
}

Block IntersectBlocks(const Block& a, const Block& b) {
  Block out;
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t begin = std::max(a.offsets[d], b.offsets[d]);
    const int64_t end = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    out.offsets.push_back(begin);
    out.sizes.push_back(std::max<int64_t>(end - begin, 0));
  }
  return out;
}

nlohmann::json ShardedCheckpointMetadataToJson(const ShardedCheckpointMetadata& meta) {
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [name, t] : meta.tensors) {
    nlohmann::json blocks = nlohmann::json::array();
    for (const SavedBlock& b : t.blocks) {
      blocks.push_back({{"rank", b.rank}, {"offsets", b.block.offsets}, {"sizes", b.block.sizes}});
    }
    tensors[name] = {{"shape", t.shape}, {"dtype", t.dtype}, {"blocks", std::move(blocks)}};
  }
  return {{"format", kShardedCheckpointFormat}, {"world_size", meta.world_size}, {"tensors", std::move(tensors)}};
}

absl::Status ValidateTensorBlocks(const std::string& name, const TensorBlocks& t, int64_t world_size) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " of shape ", Dims(t.shape), ": ", why));
  };
  if (std::any_of(t.shape.begin(), t.shape.end(), [](int64_t d) { return d < 0; })) return bad("negative size");
  int64_t covered = 0;
  for (size_t i = 0; i < t.blocks.size(); ++i) {
    const SavedBlock& s = t.blocks[i];
    const Block& b = s.block;
    if (s.rank < 0 || s.rank >= world_size) {
      return bad(absl::StrCat("block of rank ", s.rank, " but the checkpoint has ", world_size, " ranks"));
    }
    if (b.offsets.size() != t.shape.size() || b.sizes.size() != t.shape.size()) {
      return bad(absl::StrCat("block of rank ", s.rank, " (", b.ToString(), ") has the wrong number of dims"));
    }
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (b.offsets[d] < 0 || b.sizes[d] < 0 || b.offsets[d] + b.sizes[d] > t.shape[d]) {
        return bad(absl::StrCat("block of rank ", s.rank, " (", b.ToString(), ") exceeds dim ", d));
      }
    }
    for (size_t k = 0; k < i; ++k) {
      if (IntersectBlocks(b, t.blocks[k].block).numel() > 0) {
        return bad(absl::StrCat("blocks of rank ", t.blocks[k].rank, " (", t.blocks[k].block.ToString(),
                                ") and rank ", s.rank, " (", b.ToString(), ") overlap"));
      }
    }
    covered += b.numel();
  }
  const int64_t numel = WholeBlock(t.shape).numel();
  if (covered != numel) {
    return bad(absl::StrCat("blocks cover ", covered, " of ", numel, " elements"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardedCheckpointMetadata> ParseShardedCheckpointMetadata(const nlohmann::json& json,
                                                                         const std::string& path) {
  auto loss = [&](const std::string& why) { return absl::DataLossError(absl::StrCat(path, ": ", why)); };
  if (!json.is_object() || !json.contains("world_size") || !json["world_size"].is_number_integer() ||
      !json.contains("tensors") || !json["tensors"].is_object()) {
    return loss("malformed (needs integer \"world_size\" and object \"tensors\")");
  }
  int64_t format = 1;
  if (json.contains("format")) {
    if (!json["format"].is_number_integer()) return loss("\"format\" is not an integer");
    format = json["format"].get<int64_t>();
  }
  if (format < 1) return loss(absl::StrCat("format ", format));
  if (format > kShardedCheckpointFormat) {
    return absl::UnimplementedError(absl::StrCat(path, ": format ", format, " is newer than this reader (",
                                                 kShardedCheckpointFormat, ")"));
  }
  ShardedCheckpointMetadata meta;
  meta.world_size = json["world_size"].get<int64_t>();
  if (meta.world_size < 1) return loss(absl::StrCat("world_size ", meta.world_size));
  for (const auto& [name, m] : json["tensors"].items()) {
    TensorBlocks t;
    if (!IntList(m, "shape", &t.shape)) return loss(absl::StrCat("tensor ", name, ": no integer list \"shape\""));
    if (m.contains("dtype") && m["dtype"].is_string()) t.dtype = m["dtype"].get<std::string>();
    if (format == 1) {
      const bool sharded = m.contains("sharded") && m["sharded"].is_boolean() && m["sharded"].get<bool>();
      t.blocks = Format1Blocks(t.shape, sharded, meta.world_size);
    } else {
      if (!m.contains("blocks") || !m["blocks"].is_array()) {
        return loss(absl::StrCat("tensor ", name, ": no \"blocks\""));
      }
      for (const auto& b : m["blocks"]) {
        SavedBlock s;
        if (!b.is_object() || !b.contains("rank") || !b["rank"].is_number_integer() ||
            !IntList(b, "offsets", &s.block.offsets) || !IntList(b, "sizes", &s.block.sizes)) {
          return loss(absl::StrCat("tensor ", name, ": malformed block ", b.dump()));
        }
        s.rank = b["rank"].get<int64_t>();
        t.blocks.push_back(std::move(s));
      }
    }
    absl::Status valid = ValidateTensorBlocks(name, t, meta.world_size);
    if (!valid.ok()) return loss(std::string(valid.message()));
    meta.tensors.emplace(name, std::move(t));
  }
  return meta;
}

}  // namespace tpudist::fsdp
