// Whole-file I/O for tests, bypassing the code under test (io/, models/gemma/
// tests), and a count of a directory's entries. Header-only, torch-free and
// GoogleTest-free. Scratch directories: testing/temp_dir.h.
// Thread-safety: thread-safe (no shared state).
#ifndef TPU_DIST_TESTING_FILES_H_
#define TPU_DIST_TESTING_FILES_H_

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace tpudist::test_support {

// Writes `bytes` to `path` (replacing it); errors are not reported: the test
// reads the file back through the code under test.
inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// The whole file; "" if it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The number of entries in `dir` (for "no temp file left behind").
inline int CountEntries(const std::string& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

}  // namespace tpudist::test_support

#endif  // TPU_DIST_TESTING_FILES_H_
