// Reads the torch DTensor oracle's fixtures (tests/oracles/dtensor_oracle.py):
// a JSON manifest `<stem>.json` next to `<stem>.safetensors`. Test-only.
//
//   auto f = OracleFixture::Load(OracleFixtureDir("dtensor"), "redistribute");
//   const nlohmann::json& cases = (*f)->manifest()["cases"];
//   at::Tensor x = (*f)->Get("g.2.5x3").value();           // [5, 3]
//   std::vector<at::Tensor> per_rank = (*f)->Pieces("c017").value();
//
// Per-rank results are stored packed: one tensor holding every rank's piece
// flattened and concatenated in rank order, with the pieces' shapes in the
// manifest's "pieces" map ({name: [[shape of rank 0], [shape of rank 1], ...]}).
// Pieces() unpacks them. Packing keeps the fixtures small: a safetensors
// header entry costs more than most of these tensors' data.
//
// The .safetensors file is read (and validated) by io/safetensors.h.
//
// Thread-safety: immutable after Load; Get/Pieces may run from every rank
// thread at once.
#ifndef TPU_DIST_TESTING_ORACLE_FIXTURE_H_
#define TPU_DIST_TESTING_ORACLE_FIXTURE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpudist::test_support {

// "$TPU_DIST_ORACLE_FIXTURES/<name>" when that is set (ctest regenerates the
// fixtures on the machine that runs the tests: entry oracle_fixtures), else
// SourceDir() (testing/source_dir.h) + "/tests/oracles/fixtures/<name>" (the committed ones, exact for the kernel
// path of their cpu.json).
std::string OracleFixtureDir(absl::string_view name);

class OracleFixture {
 public:
  // Reads `<dir>/<stem>.json` and `<dir>/<stem>.safetensors`. Errors name the
  // file and what is wrong with it.
  static absl::StatusOr<std::shared_ptr<const OracleFixture>> Load(const std::string& dir,
                                                                   const std::string& stem);

  const nlohmann::json& manifest() const { return manifest_; }

  // The stored tensor `name` (an owned copy). NotFound names the file.
  absl::StatusOr<at::Tensor> Get(const std::string& name) const;

  // The per-rank pieces of the packed tensor `name`, one per rank, shaped as
  // the manifest's "pieces" entry says. NotFound / DataLoss when the manifest
  // has no entry or the sizes do not add up.
  absl::StatusOr<std::vector<at::Tensor>> Pieces(const std::string& name) const;

 private:
  OracleFixture() = default;

  std::string path_;  // the .safetensors file, for messages
  nlohmann::json manifest_;
  std::map<std::string, at::Tensor> tensors_;
};

}  // namespace tpudist::test_support

#endif  // TPU_DIST_TESTING_ORACLE_FIXTURE_H_
