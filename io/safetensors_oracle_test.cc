// io/safetensors.h against the `safetensors` Python package (the format's
// reference implementation) in the project venv: what we write it reads
// exactly, and what it writes (its own offsets and dtype order) we read
// exactly. io/safetensors_oracle.py holds the same per-name formulas as
// Expected() below.
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "testing/files.h"
#include "testing/temp_dir.h"
#include "io/safetensors.h"
#include "testing/source_dir.h"

namespace tpudist::io {
namespace {

using test_support::SourceDir;

// Runs the oracle script; its exit status (0: agrees).
int RunOracle(const std::string& mode, const std::string& path) {
  const std::string cmd = absl::StrCat("'", TPU_DIST_PYTHON, "' '", SourceDir(), "/io/safetensors_oracle.py' ",
                                       mode, " '", path, "'");
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

// name -> tensor, matching expected() in io/safetensors_oracle.py.
std::vector<std::pair<std::string, at::Tensor>> Expected() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto floats = [](int64_t n) { return at::arange(n, at::kDouble).mul(0.5).sub(1); };
  auto ints = [](int64_t n) { return at::arange(n, at::kLong).sub(3); };
  out.emplace_back("f64", floats(6).reshape({2, 3}));                       // [2, 3]
  out.emplace_back("f32", floats(15).to(at::kFloat).reshape({3, 5}));       // [3, 5]
  out.emplace_back("f16", floats(4).to(at::kHalf).reshape({2, 2}));         // [2, 2]
  out.emplace_back("bf16", floats(7).to(at::kBFloat16));                    // [7]
  out.emplace_back("i64", ints(6).reshape({2, 3}));                         // [2, 3]
  out.emplace_back("i32", ints(4).to(at::kInt));                            // [4]
  out.emplace_back("i16", ints(4).to(at::kShort));                          // [4]
  out.emplace_back("i8", ints(4).to(at::kChar));                            // [4]
  out.emplace_back("u8", at::arange(5, at::kLong).mul(50).to(at::kByte));   // [5]
  out.emplace_back("bool", at::arange(5, at::kLong).remainder(2).eq(0));    // [5]
  out.emplace_back("scalar", at::scalar_tensor(2.5, at::kFloat));           // []
  out.emplace_back("empty", at::zeros({0, 4}));                             // [0, 4]
  // Non-contiguous on our side: the writer must lay it out row-major.
  out.emplace_back("strided", at::arange(24, at::kFloat).reshape({4, 6}).t());  // [6, 4]
  return out;
}

TEST(SafetensorsOracle, PythonReadsWhatWeWrite) {
  test_support::ScopedTempDir dir("io_test");
  const std::string path = dir / "ours.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, Expected(), {{"format", "pt"}, {"oracle", "safetensors"}}).ok());
  EXPECT_EQ(RunOracle("check", path), 0);
}

TEST(SafetensorsOracle, WeReadWhatPythonWrites) {
  test_support::ScopedTempDir dir("io_test");
  const std::string path = dir / "theirs.safetensors";
  ASSERT_EQ(RunOracle("write", path), 0);
  absl::StatusOr<SafetensorsContents> got = ReadSafetensors(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->metadata.at("format"), "pt");
  EXPECT_EQ(got->metadata.at("oracle"), "safetensors");
  const auto want = Expected();
  ASSERT_EQ(got->tensors.size(), want.size());
  auto file = SafetensorsFile::Open(path);  // the zero-copy path too
  ASSERT_TRUE(file.ok()) << file.status();
  for (const auto& [name, w] : want) {
    ASSERT_EQ(got->tensors.count(name), 1u) << name;
    const at::Tensor& t = got->tensors.at(name);
    EXPECT_EQ(t.scalar_type(), w.scalar_type()) << name;
    EXPECT_EQ(t.sizes(), w.sizes()) << name;
    EXPECT_TRUE(at::equal(t, w)) << name;
    absl::StatusOr<at::Tensor> view = (*file)->Get(name);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_TRUE(at::equal(*view, w)) << name;
  }
}

// The oracle can fail: a file whose data differs from the formulas is
// rejected by the script.
TEST(SafetensorsOracle, OracleRejectsWrongData) {
  test_support::ScopedTempDir dir("io_test");
  auto tensors = Expected();
  tensors[1].second = tensors[1].second.add(1);  // "f32" off by one
  const std::string path = dir / "wrong.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}, {"oracle", "safetensors"}}).ok());
  EXPECT_EQ(RunOracle("check", path), 1);
}

}  // namespace
}  // namespace tpudist::io
