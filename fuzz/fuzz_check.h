// FUZZ_CHECK: an invariant of the code under test. A violation prints the
// condition and a message and aborts, which libFuzzer reports as a crash
// (and the replay test as a failure) with the input that caused it.
#ifndef TPU_DIST_FUZZ_FUZZ_CHECK_H_
#define TPU_DIST_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, ...)                                                   \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, \
                   #cond);                                                     \
      std::fprintf(stderr, __VA_ARGS__);                                       \
      std::fprintf(stderr, "\n");                                              \
      std::abort();                                                            \
    }                                                                          \
  } while (0)

#endif  // TPU_DIST_FUZZ_FUZZ_CHECK_H_
