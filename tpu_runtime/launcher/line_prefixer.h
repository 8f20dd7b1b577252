// LinePrefixer: turns a child's raw output byte stream into whole lines, each
// prefixed with the child's label ("[rank  3] "), so that the launcher can
// interleave the output of many ranks without ever splitting a line.
//
// Pure (no I/O). Not thread-safe: one instance per stream, fed by one thread.
//
//   LinePrefixer p(RankLabel(3, 16));
//   p.Feed("hel");          // -> ""              (partial line held)
//   p.Feed("lo\nwor");      // -> "[rank  3] hello\n"
//   p.Finish();             // -> "[rank  3] wor\n" (EOF flushes, adds '\n')
#ifndef TPU_DIST_TPU_RUNTIME_LAUNCHER_LINE_PREFIXER_H_
#define TPU_DIST_TPU_RUNTIME_LAUNCHER_LINE_PREFIXER_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace tpudist::tpu_runtime::launcher {

// "[rank  3] " for rank 3 of 16: the rank is right-aligned to the width of the
// largest rank (world_size - 1), so all prefixes of a job have equal length.
// REQUIRES: 0 <= rank < world_size.
std::string RankLabel(int rank, int world_size);

class LinePrefixer {
 public:
  // A held partial line longer than this is emitted as if it ended in '\n'
  // (a child printing megabytes without a newline must not grow us forever).
  static constexpr size_t kDefaultMaxLine = 64 * 1024;

  explicit LinePrefixer(std::string prefix, size_t max_line = kDefaultMaxLine);

  // Consumes `bytes` and returns every line completed by them, each prefixed
  // and ending in '\n'. Bytes after the last '\n' are held for the next call.
  std::string Feed(absl::string_view bytes);

  // End of stream: returns the held partial line (prefixed, with a '\n'
  // appended), or "" when nothing is held. The prefixer can be reused after.
  std::string Finish();

  // Bytes currently held (a partial line).
  size_t pending_bytes() const { return pending_.size(); }
  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefix_;
  size_t max_line_;
  std::string pending_;
};

}  // namespace tpudist::tpu_runtime::launcher

#endif  // TPU_DIST_TPU_RUNTIME_LAUNCHER_LINE_PREFIXER_H_
