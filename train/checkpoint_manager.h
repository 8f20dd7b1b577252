// CheckpointManager: atomic, pruned checkpoints of one training run, laid
// out as Ray Train lays them out:
//
//   <storage_path>/<run_name>/
//     checkpoint_2026-12-02_13-45-05.123456/   complete: has checkpoint.json
//       model.pt ...                           whatever the trainer wrote
//       checkpoint.json                        written last (checkpoint_metadata.h)
//     .tmp_checkpoint_<time>_<pid>_<n>/        a write in progress
//     metrics.jsonl                            (metrics_log.h, not ours)
//
// Write protocol (one checkpoint):
//   1. BeginWrite() creates a fresh .tmp_checkpoint_* directory and hands
//      it out; the trainer (every rank, for a sharded checkpoint: rank 0
//      shares the path, e.g. through the store) writes its files there.
//   2. Commit() — after all writers are done (a barrier) — reads every file
//      once for its size and CRC-32 (file_checksum.h) and fsyncs it and
//      every directory, renames the temp dir to checkpoint_<timestamp>,
//      fsyncs the run dir, and only then writes checkpoint.json
//      (io/atomic_file.h: temp name, fsync, rename, fsync of the dir) with epoch, step, loss, complete=true, the
//      job fingerprint and the files with their sizes and CRC-32s. Then it
//      prunes (checkpoint_retention.h).
//   A crash at any point leaves either a .tmp_checkpoint_* dir (removed by
//   the next Open()) or a checkpoint_* dir without checkpoint.json (an
//   incomplete commit: skipped, and removed by the next Commit()).
//
// What is trusted:
//   - ListComplete/LatestComplete/Best: checkpoint.json matches its own
//     manifest_crc32, parses, says complete, and every listed file has its
//     recorded size (stat only).
//   - Verify/LatestVerified: also every byte (CRC-32). Load only a
//     checkpoint that passed Verify; LatestVerified is the resume entry.
//   A checkpoint that fails verification (torn, unparseable or bit-flipped
//   marker, wrong size, wrong CRC, missing file) is "corrupt":
//   LatestVerified reports it through options.error naming the file,
//   renames its marker to checkpoint.json.corrupt (so it never looks
//   complete again and does not count for retention) and leaves the
//   directory for inspection.
//   A file that cannot be read (EIO, EACCES, ... on every one of
//   options.io_retry's tries; checkpoint_file_reader.h) is NOT corrupt:
//   nothing is quarantined, and LatestVerified fails with the reader's
//   Unavailable "I/O error reading '<file>' ...", so that the next attempt,
//   once the storage is healthy, resumes from the same checkpoint.
//   A format-2 marker (written before checkpoint.json had its own
//   checksum) is accepted; LatestVerified warns when it resumes from one.
//
// Ordering: "latest" is the highest sequence number in checkpoint.json
// (commit order), not the directory name, so clock steps do not reorder.
//
// Assumes one live writer per run directory (rank 0 of the job, holding the
// run_dir_lock.h lock); Open() removes every .tmp_checkpoint_* it finds as
// stale. Not thread-safe: use from one thread. All filesystem errors are
// Statuses naming the path.
#ifndef TPU_DIST_TRAIN_CHECKPOINT_MANAGER_H_
#define TPU_DIST_TRAIN_CHECKPOINT_MANAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "train/checkpoint_file_reader.h"
#include "train/checkpoint_metadata.h"

namespace tpudist::train {

struct CheckpointManagerOptions {
  std::string storage_path;  // Ray's RunConfig(storage_path=...)
  std::string run_name;      // Ray's RunConfig(name=...), a single path part
  // Ray's CheckpointConfig(num_to_keep=...): <= 0 keeps all.
  int num_to_keep = 0;
  // Clock for directory names and "created"; tests inject one.
  std::function<absl::Time()> now;  // default absl::Now
  // Receives one line per skipped or cleaned-up directory; default: stderr
  // "[checkpoint] warning: ...".
  std::function<void(absl::string_view)> warn;
  // Receives one line per corrupt checkpoint found by LatestVerified, naming
  // the bad file; default: stderr "[checkpoint] error: ...".
  std::function<void(absl::string_view)> error;
  // The reads of verification and their retries on I/O errors; tests
  // inject faults through file_ops (unset members: the real filesystem).
  CheckpointFileOps file_ops;
  IoRetryPolicy io_retry;
};

// A write in progress: the directory to write into. Plain value; dropping it
// without Commit/Abandon leaves the directory for the next Open() to clean.
struct PendingCheckpoint {
  std::string path;  // <run_dir>/.tmp_checkpoint_...
};

// What the trainer reports with a checkpoint (Ray: train.report(metrics)).
struct CheckpointReport {
  int64_t epoch = 0;
  int64_t step = 0;  // batches consumed in `epoch` (resume point)
  double loss = 0.0;
  JobFingerprint job;  // recorded as checkpoint.json "job"
};

struct CheckpointInfo {
  std::string path;  // <run_dir>/checkpoint_<timestamp>
  CheckpointMetadata metadata;
};

// <storage_path>/<run_name>. InvalidArgument for an empty storage_path or
// a run_name that is empty, "." / "..", or contains '/'. Pure.
absl::StatusOr<std::string> RunDirPath(const std::string& storage_path,
                                       const std::string& run_name);

class CheckpointManager {
 public:
  // Creates <storage_path>/<run_name> if needed and removes stale temp dirs.
  // InvalidArgument for an empty storage_path or a run_name that is empty,
  // "." / "..", or contains '/'.
  static absl::StatusOr<std::unique_ptr<CheckpointManager>> Open(
      CheckpointManagerOptions options);

  const std::string& run_dir() const { return run_dir_; }

  absl::StatusOr<PendingCheckpoint> BeginWrite();

  // Makes `pending` a complete checkpoint (protocol above) and prunes.
  // FailedPrecondition if `pending` is not a temp dir of this run or holds
  // a file named checkpoint.json.
  absl::StatusOr<CheckpointInfo> Commit(const PendingCheckpoint& pending,
                                        const CheckpointReport& report);

  // Deletes the temp directory of an unwanted write.
  absl::Status Abandon(const PendingCheckpoint& pending);

  // Complete checkpoints on disk (sizes checked, not checksums), oldest
  // first (rescans; warns on skips).
  absl::StatusOr<std::vector<CheckpointInfo>> ListComplete() const;

  // The newest complete checkpoint (sizes checked); nullopt when none.
  absl::StatusOr<std::optional<CheckpointInfo>> LatestComplete() const;

  // The lowest-loss complete checkpoint (sizes checked); nullopt when none.
  // Verify() it before loading from it.
  absl::StatusOr<std::optional<CheckpointInfo>> Best() const;

  // Re-reads every file of `checkpoint` and compares sizes and CRC-32s with
  // its checkpoint.json. DataLoss naming the first bad file; Unavailable
  // (an I/O error, not corruption) naming a file that could not be read.
  absl::Status Verify(const CheckpointInfo& checkpoint) const;

  // For resume: the newest checkpoint that verifies (every byte). Each
  // corrupt one met on the way (and every one whose marker is torn or
  // fails its manifest_crc32) is reported through options.error and
  // quarantined (see above). nullopt when the run directory holds no
  // checkpoint at all; DataLoss listing the bad files (and the dirs
  // quarantined earlier) when it holds some but none verifies, on this and
  // every later call. Unavailable naming the file, quarantining nothing
  // more, when a checkpoint.json or a file of the checkpoint it would pick
  // cannot be read (after retries). Mutates the run dir: call only as its
  // one writer.
  absl::StatusOr<std::optional<CheckpointInfo>> LatestVerified();

 private:
  explicit CheckpointManager(CheckpointManagerOptions options,
                             std::string run_dir)
      : options_(std::move(options)),
        run_dir_(std::move(run_dir)),
        reader_(options_.file_ops, options_.io_retry) {}

  // One pass over the run dir: complete ones (sizes ok) by sequence, corrupt
  // ones (dir, why), unreadable ones (dir, the I/O error), ones quarantined
  // earlier, and incomplete commits (no marker, not quarantined).
  struct Scan {
    std::vector<CheckpointInfo> complete;
    std::vector<std::pair<std::string, std::string>> corrupt;
    std::vector<std::pair<std::string, std::string>> unreadable;
    std::vector<std::string> quarantined;
    std::vector<std::string> incomplete;
  };
  absl::StatusOr<Scan> ScanRunDir() const;
  void Quarantine(const std::string& dir, absl::string_view why);
  // Unavailable for LatestVerified: `why` (the reader's I/O errors), and
  // that nothing was quarantined.
  absl::Status UnreadableError(absl::string_view why) const;

  absl::Status RemoveStaleTempDirs();
  absl::Status Prune(int64_t latest_sequence);
  void Warn(absl::string_view msg) const;
  std::string UniqueFinalName() const;

  CheckpointManagerOptions options_;
  std::string run_dir_;
  CheckpointFileReader reader_;
  int64_t temp_counter_ = 0;
};

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_CHECKPOINT_MANAGER_H_
