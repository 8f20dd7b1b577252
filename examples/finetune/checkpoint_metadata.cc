#include "examples/finetune/checkpoint_metadata.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "examples/finetune/file_checksum.h"
#include "examples/finetune/internal/fs_util.h"

namespace tpudist::finetune {
namespace {

constexpr int kFormat = 2;
constexpr char kTimeFormat[] = "%Y-%m-%dT%H:%M:%E6S%Ez";

}  // namespace

std::string CheckpointMetadataToJson(const CheckpointMetadata& meta) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["sequence"] = meta.sequence;
  j["epoch"] = meta.epoch;
  j["step"] = meta.step;
  if (std::isfinite(meta.loss)) {
    j["loss"] = meta.loss;
  } else {
    j["loss"] = nullptr;
  }
  j["complete"] = meta.complete;
  j["created"] = absl::FormatTime(kTimeFormat, meta.created, absl::UTCTimeZone());
  nlohmann::ordered_json job = nlohmann::ordered_json::object();
  for (const auto& [k, v] : meta.job) job[k] = v;
  j["job"] = std::move(job);
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const CheckpointFile& f : meta.files) {
    nlohmann::ordered_json e;
    e["path"] = f.path;
    e["bytes"] = f.bytes;
    e["crc32"] = Crc32ToHex(f.crc32);
    files.push_back(std::move(e));
  }
  j["files"] = std::move(files);
  return j.dump() + "\n";
}

absl::StatusOr<CheckpointMetadata> ParseCheckpointMetadata(
    absl::string_view json, absl::string_view path) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path, ": ", why));
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json.begin(), json.end());
  } catch (const nlohmann::json::exception& e) {
    return bad(absl::StrCat("bad JSON: ", e.what()));
  }
  if (!j.is_object()) return bad("not a JSON object");
  CheckpointMetadata m;
  try {
    if (j.value("format", 0) != kFormat) {
      return bad(absl::StrCat("unsupported format ", j.value("format", 0),
                              " (this build reads format ", kFormat,
                              ", with per-file checksums)"));
    }
    for (const char* key : {"sequence", "epoch", "step"}) {
      if (!j.contains(key) || !j[key].is_number_integer()) {
        return bad(absl::StrCat("field \"", key, "\" missing or not an integer"));
      }
    }
    m.sequence = j["sequence"].get<int64_t>();
    m.epoch = j["epoch"].get<int64_t>();
    m.step = j["step"].get<int64_t>();
    const auto& loss = j["loss"];
    if (loss.is_null()) {
      m.loss = std::numeric_limits<double>::quiet_NaN();
    } else if (loss.is_number()) {
      m.loss = loss.get<double>();
    } else {
      return bad("field \"loss\" not a number");
    }
    if (!j.contains("complete") || !j["complete"].is_boolean()) {
      return bad("field \"complete\" missing or not a boolean");
    }
    m.complete = j["complete"].get<bool>();
    std::string err;
    if (!j.contains("created") || !j["created"].is_string() ||
        !absl::ParseTime(kTimeFormat, j["created"].get<std::string>(),
                         &m.created, &err)) {
      return bad(absl::StrCat("field \"created\" missing or malformed ", err));
    }
    if (!j.contains("files") || !j["files"].is_array()) {
      return bad("field \"files\" missing or not an array");
    }
    if (!j.contains("job") || !j["job"].is_object()) {
      return bad("field \"job\" missing or not an object");
    }
    for (const auto& [k, v] : j["job"].items()) {
      if (!v.is_string()) return bad(absl::StrCat("job field \"", k, "\" not a string"));
      m.job[k] = v.get<std::string>();
    }
    for (const auto& f : j["files"]) {
      if (!f.is_object() || !f.contains("path") || !f["path"].is_string() ||
          !f.contains("bytes") || !f["bytes"].is_number_integer() ||
          !f.contains("crc32") || !f["crc32"].is_string()) {
        return bad("malformed entry in \"files\"");
      }
      const std::optional<uint32_t> crc = Crc32FromHex(f["crc32"].get<std::string>());
      if (!crc.has_value()) return bad("malformed crc32 in \"files\"");
      m.files.push_back({f["path"].get<std::string>(), f["bytes"].get<int64_t>(), *crc});
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(absl::StrCat("bad field: ", e.what()));
  }
  return m;
}

absl::Status VerifyCheckpointFiles(const std::string& dir,
                                   const CheckpointMetadata& meta,
                                   VerifyMode mode,
                                   absl::Span<const std::string> only) {
  std::vector<const CheckpointFile*> todo;
  if (only.empty()) {
    for (const CheckpointFile& f : meta.files) todo.push_back(&f);
  } else {
    for (const std::string& rel : only) {
      auto it = std::find_if(meta.files.begin(), meta.files.end(),
                             [&](const CheckpointFile& f) { return f.path == rel; });
      if (it == meta.files.end()) {
        return absl::DataLossError(absl::StrCat("checkpoint file '", dir, "/", rel,
                                                "' is not listed in ", kCheckpointMetadataFile));
      }
      todo.push_back(&*it);
    }
  }
  for (const CheckpointFile* f : todo) {
    const std::string path = absl::StrCat(dir, "/", f->path);
    auto size = internal::FileSize(path);
    if (!size.ok()) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file '", path, "' unreadable: ", size.status().message()));
    }
    if (*size != f->bytes) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file '", path, "' has ", *size, " bytes, ",
          kCheckpointMetadataFile, " records ", f->bytes, " (truncated?)"));
    }
    if (mode != VerifyMode::kChecksums) continue;
    absl::StatusOr<FileDigest> d = DigestFile(path);
    if (!d.ok()) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file '", path, "' unreadable: ", d.status().message()));
    }
    if (d->bytes != f->bytes || d->crc32 != f->crc32) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file '", path, "' is corrupt: crc32 ", Crc32ToHex(d->crc32),
          " over ", d->bytes, " bytes, ", kCheckpointMetadataFile, " records ",
          Crc32ToHex(f->crc32), " over ", f->bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace tpudist::finetune
