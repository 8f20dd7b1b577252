#include "fsdp/fully_shard/safetensors_io.h"

#include <cerrno>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/common/safetensors_header.h"

namespace tpudist::fsdp {
namespace {

const std::vector<std::pair<std::string, at::ScalarType>>& DtypeNames() {
  static const auto* names = new std::vector<std::pair<std::string, at::ScalarType>>{
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"U8", at::kByte},  {"BOOL", at::kBool}};
  return *names;
}

absl::StatusOr<std::string> NameOf(at::ScalarType t) {
  for (const auto& [n, s] : DtypeNames()) {
    if (s == t) return n;
  }
  return absl::InvalidArgumentError(absl::StrCat("safetensors: unsupported dtype ", c10::toString(t)));
}

absl::StatusOr<at::ScalarType> TypeOf(const std::string& name) {
  for (const auto& [n, s] : DtypeNames()) {
    if (n == name) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat("safetensors: unsupported dtype ", name));
}

}  // namespace

absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<at::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (header.contains(name)) return absl::InvalidArgumentError(absl::StrCat("safetensors: duplicate ", name));
    absl::StatusOr<std::string> dtype = NameOf(t.scalar_type());
    if (!dtype.ok()) return dtype.status();
    at::Tensor c = t.detach().cpu().contiguous();
    const uint64_t bytes = c.nbytes();
    header[name] = {{"dtype", *dtype}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(std::move(c));
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::ErrnoToStatus(errno, absl::StrCat("safetensors: cannot create ", tmp));
    const uint64_t n = text.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const at::Tensor& c : data) {
      out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
    }
    out.flush();  // buffered bytes hit the disk here or at close: both checked
    out.close();
    if (!out) {
      const int err = errno;
      std::remove(tmp.c_str());
      return absl::ErrnoToStatus(err, absl::StrCat("safetensors: write failed for ", tmp, " (",
                                                   8 + text.size(), " bytes of header)"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("safetensors: rename ", tmp, " -> ", path, " failed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsContents> ReadSafetensorsFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("safetensors: cannot open ", path));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Every size, range and field checked here, before any tensor exists.
  absl::StatusOr<models::SafetensorsHeader> header = models::ParseSafetensorsHeader(bytes, path);
  if (!header.ok()) return header.status();
  const char* base = bytes.data() + header->data_offset;
  SafetensorsContents out;
  out.metadata = std::move(header->metadata);
  for (const auto& [name, entry] : header->entries) {
    absl::StatusOr<at::ScalarType> type = TypeOf(entry.dtype);
    if (!type.ok()) return absl::DataLossError(absl::StrCat(path, ": tensor '", name, "': ", type.status().message()));
    at::Tensor t = at::empty(entry.shape, at::TensorOptions().dtype(*type));
    if (t.nbytes() > 0) std::memcpy(t.data_ptr(), base + entry.begin, t.nbytes());
    out.tensors[name] = std::move(t);
  }
  return out;
}

}  // namespace tpudist::fsdp
