// Scratch directories for tests and benchmarks that leave nothing behind.
//
// ScopedTempDir: <$TMPDIR or /tmp>/<prefix>_XXXXXX, removed with everything
// in it when the object is destroyed -- by the process that created it only,
// so a rank forked after construction (which inherits a copy of the object
// and may run destructors or exit handlers) never deletes the directory under
// its siblings.
//
// ProcessTempDir: the same kind of directory for call sites that want a plain
// path (forked-rank harnesses); removed when the creating process exits
// normally (std::exit / return from main), not when a forked child exits. A
// process killed by a signal leaves its directories behind.
//
// Thread-safety: ScopedTempDir objects are independent; ProcessTempDir may be
// called from any thread. Header-only and torch-free, so test binaries and the
// bench/ programs include it without linking tpu_dist::testing.
#ifndef TPU_DIST_TESTING_TEMP_DIR_H_
#define TPU_DIST_TESTING_TEMP_DIR_H_

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace tpudist::test_support {

// "<$TMPDIR or /tmp>/<prefix>_XXXXXX" made by mkdtemp; "" if that fails.
inline std::string MakeTempDirPath(std::string_view prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/" +
                     std::string(prefix) + "_XXXXXX";
  const char* made = ::mkdtemp(tmpl.data());
  return made != nullptr ? std::string(made) : std::string();
}

class ScopedTempDir {
 public:
  explicit ScopedTempDir(std::string_view prefix = "tpud_tmp")
      : path_(MakeTempDirPath(prefix)), owner_(::getpid()) {}
  ~ScopedTempDir() {
    if (path_.empty() || ::getpid() != owner_) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  // The directory; "" if mkdtemp failed (callers assert on it).
  const std::string& path() const { return path_; }
  std::string operator/(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  std::string path_;
  pid_t owner_;
};

namespace internal {

// Directories made by ProcessTempDir in this process; removed at exit.
struct ProcessTempDirs {
  std::mutex mu;
  std::vector<std::string> paths;
  pid_t owner = 0;
};

inline ProcessTempDirs& Registry() {
  // Leaked on purpose: the exit handler runs after static destructors may
  // have started.
  static ProcessTempDirs* dirs = new ProcessTempDirs;
  return *dirs;
}

inline void RemoveProcessTempDirs() {
  ProcessTempDirs& dirs = Registry();
  std::lock_guard<std::mutex> lock(dirs.mu);
  if (::getpid() != dirs.owner) return;  // a forked child exiting
  for (const std::string& path : dirs.paths) {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  dirs.paths.clear();
}

}  // namespace internal

// A fresh directory removed (with its contents) when this process exits
// normally. "" if mkdtemp fails.
inline std::string ProcessTempDir(std::string_view prefix) {
  std::string path = MakeTempDirPath(prefix);
  if (path.empty()) return path;
  internal::ProcessTempDirs& dirs = internal::Registry();
  std::lock_guard<std::mutex> lock(dirs.mu);
  if (dirs.owner != ::getpid()) {
    // First directory of this process (or of a forked child that makes its
    // own): its exit handler removes only what it created.
    dirs.paths.clear();
    if (dirs.owner == 0) std::atexit(internal::RemoveProcessTempDirs);
    dirs.owner = ::getpid();
  }
  dirs.paths.push_back(path);
  return path;
}

}  // namespace tpudist::test_support

#endif  // TPU_DIST_TESTING_TEMP_DIR_H_
