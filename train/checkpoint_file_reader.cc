#include "train/checkpoint_file_reader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "train/internal/fs_util.h"

namespace tpudist::train {
namespace {

// Errors that say something about the file itself, not about the read.
bool IsFinal(const absl::Status& s) {
  return absl::IsNotFound(s) || absl::IsFailedPrecondition(s);
}

// Calls `op(path)` up to retry.attempts times while it fails with an error
// that is not final; the last such error becomes Unavailable "I/O error".
template <typename T, typename Op>
absl::StatusOr<T> WithRetries(const Op& op, const std::string& path,
                              const IoRetryPolicy& retry) {
  const int attempts = std::max(1, retry.attempts);
  const absl::Time start = absl::Now();
  absl::Duration backoff = retry.first_backoff;
  absl::Status last;
  for (int i = 0; i < attempts; ++i) {
    if (i > 0) {
      absl::SleepFor(backoff);
      backoff *= 2;
    }
    absl::StatusOr<T> r = op(path);
    if (r.ok() || IsFinal(r.status())) return r;
    last = r.status();
  }
  return absl::UnavailableError(absl::StrCat(
      "I/O error reading '", path, "' (", attempts,
      attempts == 1 ? " try" : " tries", " over ",
      absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))),
      "): ", last.message()));
}

}  // namespace

CheckpointFileReader::CheckpointFileReader(CheckpointFileOps ops,
                                           IoRetryPolicy retry)
    : ops_(std::move(ops)), retry_(retry) {
  if (!ops_.read_file) ops_.read_file = internal::ReadFile;
  if (!ops_.file_size) ops_.file_size = internal::FileSize;
  if (!ops_.digest_file) ops_.digest_file = DigestFile;
}

absl::StatusOr<std::string> CheckpointFileReader::ReadFile(
    const std::string& path) const {
  return WithRetries<std::string>(ops_.read_file, path, retry_);
}

absl::StatusOr<int64_t> CheckpointFileReader::FileSize(
    const std::string& path) const {
  return WithRetries<int64_t>(ops_.file_size, path, retry_);
}

absl::StatusOr<FileDigest> CheckpointFileReader::Digest(
    const std::string& path) const {
  return WithRetries<FileDigest>(ops_.digest_file, path, retry_);
}

bool IsCheckpointIoError(const absl::Status& status) {
  return absl::IsUnavailable(status);
}

}  // namespace tpudist::train
