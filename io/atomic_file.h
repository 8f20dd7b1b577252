// Atomic, durable replacement of a whole file: the one write-temp-then-rename
// of the project (checkpoint shards and metadata, safetensors, the fine-tune's
// checkpoint.json and metrics.jsonl).
//
//   absl::Status st = io::WriteFileAtomically(dir + "/metadata.json", text);
//
// Sequence: create or truncate "<path>.tmp" in the same directory (so the
// rename never crosses a filesystem), write every byte, fsync it, close it,
// rename(2) it over `path`, then fsync the directory so the rename itself
// survives a crash. A reader of `path` sees either the old contents or the
// new ones, never a mix; after OK returns, the new contents are on disk.
// On any failure before the rename the temp file is removed and `path` is
// untouched; a failure of the final directory fsync leaves the new file in
// place (not yet known durable) and says so.
//
// Errors: absl::ErrnoToStatus of the failing call (ENOENT -> NotFound, ENOSPC
// -> ResourceExhausted, EACCES -> PermissionDenied, ...), the message naming
// the file that failed (the temp name, or the directory), the target `path`,
// what was being done, and strerror.
//
// Torch-free and includes nothing of ours. It lives in io/ (a base folder
// below fsdp/ and models/, above tpu_runtime/): tpu_runtime/ writes no file
// by temp-and-rename today; should it need to, this file pair moves down into
// a torch-free target rather than tpu_runtime/ including upward.
//
// Thread-safety: REQUIRES at most one writer per `path` at a time (the temp
// name is fixed: "<path>.tmp"); writers of different paths are independent.
#ifndef TPU_DIST_IO_ATOMIC_FILE_H_
#define TPU_DIST_IO_ATOMIC_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tpudist::io {

// The temp file WriteFileAtomically writes before its rename: "<path>.tmp".
std::string AtomicTempPath(const std::string& path);

// Replaces `path` with the concatenation of `pieces` (written in order, never
// copied into one buffer: a safetensors file passes its header and then each
// tensor's bytes). The pieces must stay valid for the call. Files are created
// with mode 0644 (before umask).
absl::Status WriteFileAtomically(const std::string& path, absl::Span<const absl::string_view> pieces);

// Replaces `path` with `contents`.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace tpudist::io

#endif  // TPU_DIST_IO_ATOMIC_FILE_H_
