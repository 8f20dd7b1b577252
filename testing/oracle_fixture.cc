#include "testing/oracle_fixture.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "io/safetensors.h"
#include "testing/source_dir.h"

namespace tpudist::test_support {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::string OracleFixtureDir(absl::string_view name) {
  const char* fresh = std::getenv("TPU_DIST_ORACLE_FIXTURES");
  if (fresh != nullptr && *fresh != '\0') return absl::StrCat(fresh, "/", name);
  return absl::StrCat(SourceDir(), "/tests/oracles/fixtures/", name);
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
  absl::StatusOr<io::SafetensorsContents> contents = io::ReadSafetensors(fixture->path_);
  if (!contents.ok()) return contents.status();
  fixture->tensors_ = std::move(contents->tensors);
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

}  // namespace tpudist::test_support
