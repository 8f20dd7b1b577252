// Test-only: a fresh directory under TEST_TMPDIR or /tmp, removed when the
// object goes out of scope. Not part of the library.
#ifndef EXAMPLES_FINETUNE_INTERNAL_TEST_TEMP_DIR_H_
#define EXAMPLES_FINETUNE_INTERNAL_TEST_TEMP_DIR_H_

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace tpudist::finetune::internal {

class TestTempDir {
 public:
  TestTempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string tmpl =
        std::string(base != nullptr ? base : "/tmp") + "/finetune_test_XXXXXX";
    char* made = ::mkdtemp(tmpl.data());
    if (made != nullptr) path_ = made;
  }
  ~TestTempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TestTempDir(const TestTempDir&) = delete;
  TestTempDir& operator=(const TestTempDir&) = delete;

  const std::string& path() const { return path_; }  // "" if mkdtemp failed

 private:
  std::string path_;
};

}  // namespace tpudist::finetune::internal

#endif  // EXAMPLES_FINETUNE_INTERNAL_TEST_TEMP_DIR_H_
