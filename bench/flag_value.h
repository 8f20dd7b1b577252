// FlagValue and StripFlags: the pieces of the benchmarks' hand-written flag
// parsers, which take their own flags out of argv and leave Google
// Benchmark's there.
//
// Thread-safety: pure function.
#ifndef TPU_DIST_BENCH_FLAG_VALUE_H_
#define TPU_DIST_BENCH_FLAG_VALUE_H_

#include <cstring>
#include <string>

namespace tpudist::bench {

// The text after `prefix` (e.g. "--world=") if `arg` starts with it, else
// nullptr. The result points into `arg`: valid while `arg` is.
inline const char* FlagValue(const std::string& arg, const char* prefix) {
  const size_t n = std::strlen(prefix);
  return arg.compare(0, n, prefix) == 0 ? arg.c_str() + n : nullptr;
}

// Calls take(arg) for each of argv[1..*argc); the arguments it returns false
// for (not ours: Google Benchmark's) move to the front, in order, and *argc
// becomes their count plus one (argv[0] stays). REQUIRES: argv holds *argc
// entries.
template <typename Take>
void StripFlags(int* argc, char** argv, Take take) {
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    if (!take(std::string(argv[i]))) argv[out++] = argv[i];
  }
  *argc = out;
}

}  // namespace tpudist::bench

#endif  // TPU_DIST_BENCH_FLAG_VALUE_H_
