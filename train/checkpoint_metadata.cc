#include "train/checkpoint_metadata.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "train/file_checksum.h"

namespace tpudist::train {
namespace {

constexpr int kFormat = 3;        // written: manifest_crc32 required
constexpr int kLegacyFormat = 2;  // read too: no manifest_crc32
constexpr char kTimeFormat[] = "%Y-%m-%dT%H:%M:%E6S%Ez";
// The last member: `,"manifest_crc32":"<8 hex>"}` then "\n".
constexpr absl::string_view kManifestKey = ",\"manifest_crc32\":\"";
constexpr absl::string_view kManifestEnd = "\"}";

// Checks the manifest checksum of `json` if it has one. True when it has
// one and it matches, false when it has none, DataLoss when it has a
// malformed or wrong one.
absl::StatusOr<bool> CheckManifestChecksum(absl::string_view json,
                                           absl::string_view path) {
  const size_t at = json.rfind(kManifestKey);
  if (at == absl::string_view::npos) return false;
  absl::string_view tail = json.substr(at + kManifestKey.size());
  std::optional<uint32_t> recorded;
  if (tail.size() >= 8) {
    recorded = Crc32FromHex(tail.substr(0, 8));
    // Exactly as written (lowercase): 'a' -> 'A' is a one-bit flip too.
    if (recorded.has_value() && Crc32ToHex(*recorded) != tail.substr(0, 8)) {
      recorded.reset();
    }
    tail.remove_prefix(8);
  }
  if (!recorded.has_value() ||
      (tail != kManifestEnd && tail != absl::StrCat(kManifestEnd, "\n"))) {
    return absl::DataLossError(absl::StrCat(
        path, " is corrupt: \"manifest_crc32\" is malformed or not the last "
              "member"));
  }
  const uint32_t actual = Crc32(json.substr(0, at));
  if (actual != *recorded) {
    return absl::DataLossError(absl::StrCat(
        path, " is corrupt: its bytes have crc32 ", Crc32ToHex(actual),
        ", its \"manifest_crc32\" records ", Crc32ToHex(*recorded),
        " (changed after it was written)"));
  }
  return true;
}

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
  std::string body = j.dump();
  body.pop_back();  // the closing '}': manifest_crc32 goes before it
  const uint32_t crc = Crc32(body);
  return absl::StrCat(body, kManifestKey, Crc32ToHex(crc), kManifestEnd, "\n");
}

absl::StatusOr<CheckpointMetadata> ParseCheckpointMetadata(
    absl::string_view json, absl::string_view path) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path, ": ", why));
  };
  absl::StatusOr<bool> has_checksum = CheckManifestChecksum(json, path);
  if (!has_checksum.ok()) return has_checksum.status();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json.begin(), json.end());
  } catch (const nlohmann::json::exception& e) {
    return bad(absl::StrCat("bad JSON: ", e.what()));
  }
  if (!j.is_object()) return bad("not a JSON object");
  CheckpointMetadata m;
  try {
    const int format = j.value("format", 0);
    if (format != kFormat && format != kLegacyFormat) {
      return bad(absl::StrCat("unsupported format ", format,
                              " (this build reads formats ", kLegacyFormat, " and ", kFormat,
                              ", with per-file checksums)"));
    }
    if (format == kFormat && !*has_checksum) {
      return absl::DataLossError(absl::StrCat(path, " is corrupt: format ", kFormat,
                                              " but no \"manifest_crc32\" as its last member"));
    }
    m.manifest_checksum = *has_checksum;
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
                                   absl::Span<const std::string> only,
                                   const CheckpointFileReader& reader) {
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
    absl::StatusOr<int64_t> size = reader.FileSize(path);
    if (!size.ok()) {
      if (IsCheckpointIoError(size.status())) return size.status();
      return absl::DataLossError(absl::StrCat(
          "checkpoint file '", path, "' unreadable: ", size.status().message()));
    }
    if (*size != f->bytes) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file '", path, "' has ", *size, " bytes, ",
          kCheckpointMetadataFile, " records ", f->bytes, " (truncated?)"));
    }
    if (mode != VerifyMode::kChecksums) continue;
    absl::StatusOr<FileDigest> d = reader.Digest(path);
    if (!d.ok()) {
      if (IsCheckpointIoError(d.status())) return d.status();
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

}  // namespace tpudist::train
