// CheckpointStorage: a run's committed checkpoints kept at a storage URI
// (`--storage-path file:///dir` or `s3://bucket/prefix`), as Ray Train keeps
// them at RunConfig(storage_path=...), through Arrow C++'s filesystem layer
// (arrow::fs, what pyarrow.fs and so Ray Train use; the pyarrow wheel's
// bundled libarrow, see docs/finetune.md "Storage URIs").
//
// The checkpoint commit itself stays local (checkpoint_manager.h, under a
// staging run directory); this layer only copies:
//
//   <uri>/<run_name>/checkpoint_<timestamp>/   same names as the local dir
//     shards/..., model.safetensors, ...       uploaded first, any order
//     checkpoint.json                          uploaded last
//
// Upload() copies a committed, verified local checkpoint, every file first
// and checkpoint.json last: a reader (ListComplete) never takes a partial
// upload for a complete checkpoint. A remote checkpoint is "complete" when
// its checkpoint.json passes its manifest_crc32, parses, says complete, and
// every listed file is there with its recorded size. Download() copies one
// into the local run dir under a `.tmp_checkpoint_` name (removed by
// CheckpointManager::Open after a crash), checks every byte against the
// manifest (CRC-32, checkpoint_metadata.h) and only then renames it into
// place. FetchNewestVerified() is the resume entry.
//
// Credentials and endpoint: the URI's query as pyarrow.fs accepts it
// (`endpoint_override=host:port`, `scheme=http`, `region=...`), else AWS's
// standard variables (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
// AWS_SESSION_TOKEN, AWS_ENDPOINT_URL, AWS_REGION, the default credential
// chain). Messages name the URI without its query (Redacted), never a
// secret. Connect and request timeouts: 10 s / 60 s unless the URI gives
// connect_timeout (seconds).
//
// Not guarded: two jobs writing one remote run (the run_dir_lock.h lock is
// local); remote retention (remote checkpoints are never deleted).
// A build without Arrow (pyarrow's headers absent at configure time) opens
// no URI: Open() fails with Unimplemented saying so. Not thread-safe.
#ifndef TPU_DIST_TRAIN_CHECKPOINT_STORAGE_H_
#define TPU_DIST_TRAIN_CHECKPOINT_STORAGE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "train/checkpoint_metadata.h"

namespace tpudist::train {

// True for "<scheme>://..." (file://, s3://, ...): the trainer keeps such a
// storage path through CheckpointStorage. False for a plain local path. Pure.
bool IsStorageUri(absl::string_view storage_path);

// `uri` without its query ("?..."), which may carry keys. Pure.
std::string RedactedUri(absl::string_view uri);

// Whether this build can open storage URIs (it was configured with Arrow).
bool StorageUrisSupported();

struct CheckpointStorageOptions {
  std::string uri;       // --storage-path: file:///abs/dir or s3://bucket[/prefix][?query]
  std::string run_name;  // a single path part, as for RunDirPath
  // One line per skipped remote checkpoint; default: stderr "[storage] warning: ...".
  std::function<void(absl::string_view)> warn;
};

struct RemoteCheckpoint {
  std::string name;  // checkpoint_<timestamp>
  CheckpointMetadata metadata;
};

class CheckpointStorage {
 public:
  // Connects (S3: checks nothing remote yet). InvalidArgument for a URI
  // Arrow cannot parse or a bad run_name; Unimplemented in a build without
  // Arrow.
  static absl::StatusOr<std::unique_ptr<CheckpointStorage>> Open(CheckpointStorageOptions options);
  ~CheckpointStorage();

  // "<redacted uri>/<run_name>", for messages.
  const std::string& description() const { return description_; }

  // Copies the committed local checkpoint `local_dir` (checkpoint_<ts> with
  // its checkpoint.json) to <uri>/<run_name>/<basename>: the listed files,
  // then checkpoint.json. Errors name the file and the remote path.
  absl::Status Upload(const std::string& local_dir);

  // The complete remote checkpoints, oldest first (by sequence); skips and
  // warns about incomplete or damaged ones. Empty when the run has none.
  absl::StatusOr<std::vector<RemoteCheckpoint>> ListComplete() const;

  // Downloads `checkpoint` into <local_run_dir>/<name> (see above) and
  // returns that path. DataLoss when a downloaded byte does not match the
  // manifest (nothing is left behind).
  absl::StatusOr<std::string> Download(const RemoteCheckpoint& checkpoint, const std::string& local_run_dir);

  // For resume: the newest complete remote checkpoint that downloads and
  // verifies, made local (an existing <local_run_dir>/<name> with a
  // checkpoint.json is taken as is, not downloaded again). A corrupt one is
  // warned about and the next older tried. nullopt when none verifies or
  // the run has none remotely.
  absl::StatusOr<std::optional<std::string>> FetchNewestVerified(const std::string& local_run_dir);

 private:
  struct Impl;
  CheckpointStorage(CheckpointStorageOptions options, std::unique_ptr<Impl> impl);
  void Warn(absl::string_view msg) const;

  CheckpointStorageOptions options_;
  std::string description_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_CHECKPOINT_STORAGE_H_
