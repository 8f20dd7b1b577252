// Test helpers for io/ tests: a self-removing temp dir and whole-file I/O
// that bypasses the code under test. Test-only.
#ifndef TPU_DIST_IO_IO_TEST_UTIL_H_
#define TPU_DIST_IO_IO_TEST_UTIL_H_

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "testing/temp_dir.h"

namespace tpudist::io::testing {

// A fresh io_test_XXXXXX directory under $TMPDIR (else /tmp); removed with
// everything in it.
class TempDir : public ::tpudist::testing::ScopedTempDir {
 public:
  TempDir() : ScopedTempDir("io_test") {}
};

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Names of the entries in `dir` (for "no temp file left behind").
inline int CountEntries(const std::string& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

}  // namespace tpudist::io::testing

#endif  // TPU_DIST_IO_IO_TEST_UTIL_H_
