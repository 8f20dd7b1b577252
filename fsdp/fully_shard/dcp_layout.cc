#include "fsdp/fully_shard/dcp_layout.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tpudist::fsdp {
namespace {

// Offsets per key from DCP_SHARDING_INFO; empty map when the file has none.
absl::StatusOr<std::map<std::string, std::vector<int64_t>>> ShardingInfo(const DcpFileView& f) {
  std::map<std::string, std::vector<int64_t>> out;
  auto it = f.metadata.find(kDcpShardingInfoKey);
  if (it == f.metadata.end()) return out;
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(f.path, ": ", kDcpShardingInfoKey, " ", why));
  };
  const nlohmann::json j = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("is not a JSON object");
  for (const auto& [key, v] : j.items()) {
    if (!v.is_object() || !v.contains("saved_offsets") || !v["saved_offsets"].is_array()) {
      return bad(absl::StrCat("of ", key, " has no saved_offsets list"));
    }
    std::vector<int64_t> offsets;
    for (const auto& o : v["saved_offsets"]) {
      if (!o.is_number_integer() || o.get<int64_t>() < 0) {
        return bad(absl::StrCat("of ", key, " has an offset that is not a non-negative integer"));
      }
      offsets.push_back(o.get<int64_t>());
    }
    out.emplace(key, std::move(offsets));
  }
  return out;
}

}  // namespace

std::string DcpShardFileName(int64_t rank) {
  return absl::StrFormat("shard-%05d-model-00001-of-00001.safetensors", rank + 1);
}

std::map<std::string, std::string> DcpFileMetadata(
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& offsets) {
  nlohmann::json info = nlohmann::json::object();
  for (const auto& [key, o] : offsets) info[key] = {{"saved_offsets", o}};
  return {{kDcpShardingInfoKey, info.dump()}, {"DCP_VERSION", "1.0"}, {"format", "pt"}};
}

absl::StatusOr<std::map<std::string, DcpTensorIndex>> BuildDcpIndex(const std::vector<DcpFileView>& files) {
  std::map<std::string, DcpTensorIndex> index;
  std::map<std::string, size_t> first_file;  // key -> file that set its dtype
  for (size_t fi = 0; fi < files.size(); ++fi) {
    const DcpFileView& f = files[fi];
    absl::StatusOr<std::map<std::string, std::vector<int64_t>>> info = ShardingInfo(f);
    if (!info.ok()) return info.status();
    for (const auto& [key, e] : f.entries) {
      Block b{std::vector<int64_t>(e.shape.size(), 0), e.shape};
      auto o = info->find(key);
      if (o != info->end()) {
        if (o->second.size() != e.shape.size()) {
          return absl::DataLossError(absl::StrCat(f.path, ": ", key, " has ", e.shape.size(), " dims but ",
                                                  o->second.size(), " saved_offsets"));
        }
        b.offsets = o->second;
      }
      auto [it, fresh] = index.try_emplace(key, DcpTensorIndex{{}, e.dtype, {}});
      if (fresh) first_file[key] = fi;
      DcpTensorIndex& t = it->second;
      if (t.dtype != e.dtype) {
        return absl::DataLossError(absl::StrCat(f.path, ": ", key, " is ", e.dtype, " but ",
                                                files[first_file[key]].path, " has it as ", t.dtype));
      }
      if (!t.chunks.empty() && t.chunks[0].block.offsets.size() != b.offsets.size()) {
        return absl::DataLossError(absl::StrCat(f.path, ": ", key, " has ", b.offsets.size(), " dims but ",
                                                files[t.chunks[0].file].path, " has ",
                                                t.chunks[0].block.offsets.size()));
      }
      const bool dup = std::any_of(t.chunks.begin(), t.chunks.end(), [&](const DcpChunk& c) { return c.block == b; });
      if (!dup) t.chunks.push_back(DcpChunk{fi, std::move(b)});
    }
  }
  for (auto& [key, t] : index) {
    t.shape.assign(t.chunks[0].block.offsets.size(), 0);
    for (const DcpChunk& c : t.chunks) {
      for (size_t d = 0; d < t.shape.size(); ++d) {
        t.shape[d] = std::max(t.shape[d], c.block.offsets[d] + c.block.sizes[d]);
      }
    }
    // Empty chunks (a rank's empty shard) cover nothing and may sit anywhere.
    t.chunks.erase(std::remove_if(t.chunks.begin(), t.chunks.end(),
                                  [&](const DcpChunk& c) { return c.block.numel() == 0 && !t.shape.empty(); }),
                   t.chunks.end());
    TensorBlocks tiles{t.shape, t.dtype, {}};
    for (const DcpChunk& c : t.chunks) tiles.blocks.push_back(SavedBlock{static_cast<int64_t>(c.file), c.block});
    absl::Status s = ValidateTensorBlocks(key, tiles, static_cast<int64_t>(files.size()));
    if (!s.ok()) {
      return absl::DataLossError(absl::StrCat("DCP checkpoint (", files.size(), " files, e.g. ", files[0].path,
                                              "): ", s.message(), " (block ranks are file numbers)"));
    }
  }
  return index;
}

}  // namespace tpudist::fsdp
