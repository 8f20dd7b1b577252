// FlagValue: the value of a "--name=value" command-line argument, shared by
// the benchmarks' hand-written flag parsers (they strip their own flags and
// leave Google Benchmark's in argv).
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

}  // namespace tpudist::bench

#endif  // TPU_DIST_BENCH_FLAG_VALUE_H_
