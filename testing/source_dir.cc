#include "testing/source_dir.h"

#include <cstdlib>

#ifndef TPU_DIST_SOURCE_DIR_DEFAULT
#error "TPU_DIST_SOURCE_DIR_DEFAULT must be defined by the build (testing/CMakeLists.txt)"
#endif

namespace tpudist::test_support {

std::string SourceDir() {
  const char* env = std::getenv("TPU_DIST_SOURCE_DIR");
  return env != nullptr ? env : TPU_DIST_SOURCE_DIR_DEFAULT;
}

}  // namespace tpudist::test_support
