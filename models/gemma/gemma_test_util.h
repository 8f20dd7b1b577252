// Test helpers shared by the gemma_test sources: a fresh temp directory.
#ifndef TPU_DIST_MODELS_GEMMA_GEMMA_TEST_UTIL_H_
#define TPU_DIST_MODELS_GEMMA_GEMMA_TEST_UTIL_H_

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace tpudist::models::gemma::testing {

// Creates a unique directory under $TMPDIR (or /tmp); removed on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/gemma_test_XXXXXX";
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
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
