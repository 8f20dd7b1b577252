// The source tree, for tests that read committed data (data/tiny_gemma,
// tests/oracles/fixtures, testdata). Test-only; GoogleTest-free and
// torch-free (tpu_dist::testing_base).
// Thread-safety: thread-safe.
#ifndef TPU_DIST_TESTING_SOURCE_DIR_H_
#define TPU_DIST_TESTING_SOURCE_DIR_H_

#include <string>

namespace tpudist::test_support {

// $TPU_DIST_SOURCE_DIR (ctest sets it for every test) when set, else the
// source tree this library was configured from (a test binary run by hand).
std::string SourceDir();

}  // namespace tpudist::test_support

#endif  // TPU_DIST_TESTING_SOURCE_DIR_H_
