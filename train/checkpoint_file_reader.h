// CheckpointFileReader: the reads that checkpoint verification makes
// (checkpoint.json; each listed file's size and CRC-32), with bounded
// retries, so that one transient I/O error (EIO from a flaky disk, an NFS
// hiccup) is never mistaken for a corrupt checkpoint.
//
// What a caller gets back, and what it may conclude:
//   - NotFound: the file is not there (not retried). A listed file missing
//     is corruption; a missing checkpoint.json is an incomplete commit.
//   - FailedPrecondition: not a regular file (not retried): a damaged
//     layout, i.e. corruption.
//   - Unavailable, "I/O error reading '<path>' (3 tries over 0.15s): <errno
//     text of the last try>": every try failed with any other error (EIO,
//     EACCES, ESTALE, EMFILE, ...). Not evidence that the bytes are bad:
//     callers report it naming the file and never quarantine on it
//     (checkpoint_manager.h).
// Only a checksum mismatch or a parse failure, decided by the caller
// (DataLoss), is corruption.
//
// Fault injection: CheckpointFileOps holds the three raw filesystem calls;
// a test replaces one (e.g. to fail the first try of one path with EIO).
// Stateless apart from the ops; thread-safe if they are.
#ifndef TPU_DIST_TRAIN_CHECKPOINT_FILE_READER_H_
#define TPU_DIST_TRAIN_CHECKPOINT_FILE_READER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "train/file_checksum.h"

namespace tpudist::train {

// The raw calls; an unset member means the real filesystem
// (internal::ReadFile, internal::FileSize, DigestFile). Each returns
// NotFound for ENOENT and another non-OK code for any other failure.
struct CheckpointFileOps {
  std::function<absl::StatusOr<std::string>(const std::string& path)> read_file;
  std::function<absl::StatusOr<int64_t>(const std::string& path)> file_size;
  std::function<absl::StatusOr<FileDigest>(const std::string& path)> digest_file;
};

// How often a failed read is tried: `attempts` tries in all, sleeping
// `first_backoff`, then twice that, ... between them. The default bounds
// the extra time per file at 0.15 s.
struct IoRetryPolicy {
  int attempts = 3;  // < 1 counts as 1
  absl::Duration first_backoff = absl::Milliseconds(50);
};

class CheckpointFileReader {
 public:
  explicit CheckpointFileReader(CheckpointFileOps ops = {},
                                IoRetryPolicy retry = {});

  // The whole file (for checkpoint.json and other small files).
  absl::StatusOr<std::string> ReadFile(const std::string& path) const;
  // Size of a regular file (stat).
  absl::StatusOr<int64_t> FileSize(const std::string& path) const;
  // Size and CRC-32, reading every byte (file_checksum.h).
  absl::StatusOr<FileDigest> Digest(const std::string& path) const;

 private:
  CheckpointFileOps ops_;
  IoRetryPolicy retry_;
};

// The Unavailable status the reader returns after its last try, for
// callers that classify (true only for that). Pure.
bool IsCheckpointIoError(const absl::Status& status);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_CHECKPOINT_FILE_READER_H_
