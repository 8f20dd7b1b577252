// Test-only: a fresh finetune_test_XXXXXX directory under $TMPDIR or /tmp,
// removed when the object goes out of scope. Not part of the library.
#ifndef TPU_DIST_TRAIN_INTERNAL_TEST_TEMP_DIR_H_
#define TPU_DIST_TRAIN_INTERNAL_TEST_TEMP_DIR_H_

#include "testing/temp_dir.h"

namespace tpudist::train::internal {

class TestTempDir : public ::tpudist::test_support::ScopedTempDir {
 public:
  TestTempDir() : ScopedTempDir("finetune_test") {}
};

}  // namespace tpudist::train::internal

#endif  // TPU_DIST_TRAIN_INTERNAL_TEST_TEMP_DIR_H_
