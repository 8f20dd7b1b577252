#include "fsdp/testing/oracle_fixture.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace tpudist::fsdp::testing {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::StatusOr<at::ScalarType> Dtype(const std::string& name) {
  if (name == "F32") return at::kFloat;
  if (name == "F64") return at::kDouble;
  if (name == "I64") return at::kLong;
  return absl::UnimplementedError(
      absl::StrCat("safetensors dtype ", name, " (oracle files use F32/F64/I64)"));
}

// Parses a safetensors file's bytes into owned tensors.
absl::StatusOr<std::map<std::string, at::Tensor>> ParseSafetensors(const std::string& path,
                                                                   const std::string& bytes) {
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(path, ": ", what));
  };
  if (bytes.size() < 8) return corrupt("shorter than the 8-byte header length");
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);  // little-endian host
  if (header_len > bytes.size() - 8) return corrupt("header runs past the end");
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len), nullptr, false);
  if (header.is_discarded() || !header.is_object()) return corrupt("header is not a JSON object");
  const char* data = bytes.data() + 8 + header_len;
  const uint64_t data_len = bytes.size() - 8 - header_len;
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    absl::StatusOr<at::ScalarType> type = Dtype(entry.at("dtype").get<std::string>());
    if (!type.ok()) return corrupt(absl::StrCat(name, ": ", type.status().message()));
    const auto shape = entry.at("shape").get<std::vector<int64_t>>();
    const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(*type));
    const uint64_t nbytes = t.numel() * t.element_size();
    if (offsets.size() != 2 || offsets[1] > data_len || offsets[1] - offsets[0] != nbytes) {
      return corrupt(absl::StrCat(name, ": data offsets do not match its shape"));
    }
    if (nbytes > 0) std::memcpy(t.data_ptr(), data + offsets[0], nbytes);
    out.emplace(name, std::move(t));
  }
  return out;
}

}  // namespace

std::string OracleFixtureDir(absl::string_view name) {
  const char* src = std::getenv("TPU_DIST_SOURCE_DIR");
  return absl::StrCat(src ? src : TPU_DIST_SOURCE_DIR_DEFAULT, "/tests/oracles/fixtures/", name);
}

absl::StatusOr<std::shared_ptr<const OracleFixture>> OracleFixture::Load(const std::string& dir,
                                                                         const std::string& stem) {
  auto fixture = std::shared_ptr<OracleFixture>(new OracleFixture());
  fixture->path_ = absl::StrCat(dir, "/", stem, ".safetensors");
  absl::StatusOr<std::string> json_text = ReadFile(absl::StrCat(dir, "/", stem, ".json"));
  if (!json_text.ok()) return json_text.status();
  fixture->manifest_ = nlohmann::json::parse(*json_text, nullptr, false);
  if (fixture->manifest_.is_discarded()) {
    return absl::DataLossError(absl::StrCat(dir, "/", stem, ".json: not JSON"));
  }
  absl::StatusOr<std::string> bytes = ReadFile(fixture->path_);
  if (!bytes.ok()) return bytes.status();
  try {
    absl::StatusOr<std::map<std::string, at::Tensor>> tensors =
        ParseSafetensors(fixture->path_, *bytes);
    if (!tensors.ok()) return tensors.status();
    fixture->tensors_ = std::move(*tensors);
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(fixture->path_, ": malformed header: ", e.what()));
  }
  return std::shared_ptr<const OracleFixture>(std::move(fixture));
}

absl::StatusOr<at::Tensor> OracleFixture::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, " has no tensor ", name));
  }
  return it->second.clone();
}

absl::StatusOr<std::vector<at::Tensor>> OracleFixture::Pieces(const std::string& name) const {
  absl::StatusOr<at::Tensor> flat = Get(name);
  if (!flat.ok()) return flat.status();
  if (!manifest_.contains("pieces") || !manifest_["pieces"].contains(name)) {
    return absl::NotFoundError(absl::StrCat("manifest of ", path_, " has no pieces for ", name));
  }
  const nlohmann::json& shapes = manifest_["pieces"][name];
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const auto& shape_json : shapes) {
    const auto shape = shape_json.get<std::vector<int64_t>>();
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    if (offset + numel > flat->numel()) break;
    out.push_back(flat->narrow(0, offset, numel).reshape(shape).clone());
    offset += numel;
  }
  if (offset != flat->numel() || out.size() != shapes.size()) {
    return absl::DataLossError(absl::StrCat(path_, ": ", name, " holds ", flat->numel(),
                                            " elements, its pieces ", shapes.dump()));
  }
  return out;
}

}  // namespace tpudist::fsdp::testing
