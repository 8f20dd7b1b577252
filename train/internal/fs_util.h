// Small POSIX filesystem helpers for the fine-tune pieces. Every error is an
// absl::Status naming the path and the errno text. Stateless; thread-safe as
// far as the filesystem is.
#ifndef TPU_DIST_TRAIN_INTERNAL_FS_UTIL_H_
#define TPU_DIST_TRAIN_INTERNAL_FS_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpudist::train::internal {

// Whole file as bytes. A directory is an error (FailedPrecondition).
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `contents` to `path` (created or truncated) and fsyncs it.
absl::Status WriteFileSynced(const std::string& path,
                             absl::string_view contents);

// Appends `contents` to `path` (created if missing), flushes with fsync.
absl::Status AppendFileSynced(const std::string& path,
                              absl::string_view contents);

// fsync of a regular file or a directory.
absl::Status FsyncPath(const std::string& path);

// rename(2): atomic within one filesystem.
absl::Status RenamePath(const std::string& from, const std::string& to);

// mkdir -p.
absl::Status MakeDirs(const std::string& path);

// rm -rf; a missing path is OK.
absl::Status RemoveAll(const std::string& path);

// Size in bytes of a regular file.
absl::StatusOr<int64_t> FileSize(const std::string& path);

bool IsDirectory(const std::string& path);

// True for an existing regular file (following symlinks).
bool IsRegularFile(const std::string& path);

// Names (not paths) of the entries directly inside `dir`, sorted.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir);

// Regular files under `dir`, recursively, as paths relative to `dir`
// ("model.pt", "shards/rank_3.pt"), sorted.
absl::StatusOr<std::vector<std::string>> ListFilesRecursive(
    const std::string& dir);

}  // namespace tpudist::train::internal

#endif  // TPU_DIST_TRAIN_INTERNAL_FS_UTIL_H_
