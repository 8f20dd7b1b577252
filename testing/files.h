// Test helpers shared by the gemma_test sources: a fresh temp directory.
#ifndef TPU_DIST_MODELS_GEMMA_GEMMA_TEST_UTIL_H_
#define TPU_DIST_MODELS_GEMMA_GEMMA_TEST_UTIL_H_

#include <filesystem>
#include <fstream>
#include <string>

#include "testing/temp_dir.h"

namespace tpudist::models::gemma::testing {

// A fresh gemma_test_XXXXXX directory under $TMPDIR (or /tmp); removed on
// destruction.
class TempDir : public ::tpudist::testing::ScopedTempDir {
 public:
  TempDir() : ScopedTempDir("gemma_test") {}
};

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace tpudist::models::gemma::testing

#endif  // TPU_DIST_MODELS_GEMMA_GEMMA_TEST_UTIL_H_
