#include "examples/finetune/checkpoint_metadata.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "examples/finetune/internal/fs_util.h"

namespace tpudist::finetune {
namespace {

constexpr int kFormat = 1;
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
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const CheckpointFile& f : meta.files) {
    files.push_back({{"path", f.path}, {"bytes", f.bytes}});
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
      return bad(absl::StrCat("unsupported format ", j.value("format", 0)));
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
    for (const auto& f : j["files"]) {
      if (!f.is_object() || !f.contains("path") || !f["path"].is_string() ||
          !f.contains("bytes") || !f["bytes"].is_number_integer()) {
        return bad("malformed entry in \"files\"");
      }
      m.files.push_back({f["path"].get<std::string>(), f["bytes"].get<int64_t>()});
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(absl::StrCat("bad field: ", e.what()));
  }
  return m;
}

absl::Status VerifyCheckpointFiles(const std::string& dir,
                                   const CheckpointMetadata& meta) {
  for (const CheckpointFile& f : meta.files) {
    const std::string path = absl::StrCat(dir, "/", f.path);
    auto size = internal::FileSize(path);
    if (!size.ok()) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file '", path, "' unreadable: ", size.status().message()));
    }
    if (*size != f.bytes) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file '", path, "' has ", *size, " bytes, ",
          kCheckpointMetadataFile, " records ", f.bytes, " (truncated?)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tpudist::finetune
