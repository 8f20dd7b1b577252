#include "train/job_fingerprint.h"

#include <charconv>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "train/file_checksum.h"
#include "train/internal/fs_util.h"

namespace tpudist::train {
namespace {

std::string DigestText(const FileDigest& d) {
  return absl::StrCat("bytes=", d.bytes, " crc32=", Crc32ToHex(d.crc32));
}

bool IsModelFile(const std::string& name) {
  if (absl::StartsWith(name, ".")) return false;
  return absl::EndsWith(name, ".json") || absl::EndsWith(name, ".safetensors") ||
         absl::EndsWith(name, ".model");
}

}  // namespace

std::string CanonicalDouble(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

absl::StatusOr<JobFingerprint> ComputeJobFingerprint(const JobSpec& s) {
  JobFingerprint f;
  absl::StatusOr<std::vector<std::string>> names = internal::ListDir(s.model_dir);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    const std::string path = absl::StrCat(s.model_dir, "/", name);
    if (!IsModelFile(name) || internal::IsDirectory(path)) continue;
    absl::StatusOr<FileDigest> d = DigestFile(path);
    if (!d.ok()) return d.status();
    f[absl::StrCat("model/", name)] = DigestText(*d);
  }
  if (f.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model directory '", s.model_dir,
        "' has no .json, .safetensors or .model file to fingerprint"));
  }
  absl::StatusOr<FileDigest> data = DigestFile(s.dataset);
  if (!data.ok()) return data.status();
  f["dataset"] = DigestText(*data);
  f["dataset_split"] = s.dataset_split;
  f["dataset_rows"] = absl::StrCat(s.dataset_rows);
  f["include_context"] = s.include_context ? "true" : "false";
  f["max_seq_len"] = absl::StrCat(s.max_seq_len);
  f["batch_size_per_device"] = absl::StrCat(s.batch_size_per_device);
  f["num_epochs"] = absl::StrCat(s.num_epochs);
  f["lr"] = CanonicalDouble(s.lr);
  f["weight_decay"] = CanonicalDouble(s.weight_decay);
  f["seed"] = absl::StrCat(s.seed);
  f["bf16"] = s.bf16 ? "true" : "false";
  f["world_size"] = absl::StrCat(s.world_size);
  if (s.tensor_parallel != 1) f["tensor_parallel"] = absl::StrCat(s.tensor_parallel);
  return f;
}

std::vector<std::string> FingerprintDifferences(const JobFingerprint& recorded,
                                                const JobFingerprint& current) {
  std::set<std::string> keys;
  for (const auto& [k, v] : recorded) keys.insert(k);
  for (const auto& [k, v] : current) keys.insert(k);
  std::vector<std::string> out;
  for (const std::string& k : keys) {
    auto r = recorded.find(k);
    auto c = current.find(k);
    const std::string was = r == recorded.end() ? "absent" : r->second;
    const std::string now = c == current.end() ? "absent" : c->second;
    if (r != recorded.end() && c != current.end() && r->second == c->second) {
      continue;
    }
    out.push_back(absl::StrCat(k, ": ", was, " in the checkpoint, ", now, " now"));
  }
  return out;
}

}  // namespace tpudist::train
