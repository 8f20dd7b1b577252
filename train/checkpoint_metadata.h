// checkpoint.json: the small record that makes a checkpoint directory
// complete. It is the last thing written into a checkpoint (see
// checkpoint_manager.h), so its presence, "complete": true, its own
// checksum and files that match its sizes and CRC-32s are what a reader
// trusts.
//
//   {"format": 3, "sequence": 4, "epoch": 2, "step": 128, "loss": 1.9321,
//    "complete": true, "created": "2026-12-02T13:45:05.123456+00:00",
//    "job": {"lr": "0.003", "seed": "5", ...},        job_fingerprint.h
//    "files": [{"path": "model.pt", "bytes": 10485760, "crc32": "0a1b2c3d"},
//              {"path": "shards/rank_1.pt", "bytes": 4096, "crc32": ...}],
//    "manifest_crc32": "5e6f7a8b"}
//
// (written compact, on one line). "manifest_crc32" is always the last
// member and is the CRC-32 of every byte of the file before its
// `,"manifest_crc32":` (so one flipped bit anywhere, "epoch": 1 -> 3
// included, is DataLoss, never a different epoch). By hand:
//   python3 -c 'import sys,zlib; d=open(sys.argv[1],"rb").read();
//     print("%08x" % zlib.crc32(d[:d.rindex(b",\"manifest_crc32\":")]))' FILE
//
// Formats read: 3 (this build writes it; manifest_crc32 required) and 2
// (written before issue 39: per-file CRC-32s but no manifest_crc32;
// accepted, with manifest_checksum = false so the caller can warn that
// its fields are unprotected). A manifest_crc32 present is checked
// whatever "format" says. Format 1 (sizes only, no job) is refused as
// unverifiable. A NaN loss is written as null (JSON has no NaN) and read
// back as NaN. The CRC-32 is zlib's (file_checksum.h says why).
// Plain values; pure functions except VerifyCheckpointFiles (reads files).
#ifndef TPU_DIST_TRAIN_CHECKPOINT_METADATA_H_
#define TPU_DIST_TRAIN_CHECKPOINT_METADATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "train/checkpoint_file_reader.h"
#include "train/job_fingerprint.h"

namespace tpudist::train {

inline constexpr char kCheckpointMetadataFile[] = "checkpoint.json";

struct CheckpointFile {
  std::string path;  // relative to the checkpoint directory, '/'-separated
  int64_t bytes = 0;
  uint32_t crc32 = 0;  // zlib CRC-32 of the whole file
};

struct CheckpointMetadata {
  int64_t sequence = 0;  // commit order within the run, from 1
  int64_t epoch = 0;     // as reported by the trainer
  int64_t step = 0;      // batches consumed in `epoch` (resume point)
  double loss = 0.0;
  bool complete = false;
  absl::Time created;
  JobFingerprint job;  // empty when the writer gave none
  std::vector<CheckpointFile> files;
  // Read back: false for a format-2 file (no manifest_crc32, so a damaged
  // field would go unnoticed). Ignored when writing (always format 3).
  bool manifest_checksum = true;
};

// One JSON document in format 3, manifest_crc32 last, trailing newline.
std::string CheckpointMetadataToJson(const CheckpointMetadata& meta);

// Checks manifest_crc32 and parses a checkpoint.json body; `path` names it
// in errors (DataLoss: bad checksum, bad JSON, a missing or mistyped field,
// an unsupported format).
absl::StatusOr<CheckpointMetadata> ParseCheckpointMetadata(
    absl::string_view json, absl::string_view path);

enum class VerifyMode {
  kSizes,      // stat only: cheap, catches truncation and deletion
  kChecksums,  // reads every byte: also catches bytes overwritten in place
};

// Checks that every listed file exists under `dir` with its recorded size
// (and, for kChecksums, CRC-32). With a non-empty `only`, checks just those
// relative paths, each of which must be listed. DataLoss naming the file
// and both values for a missing, wrong-sized or wrong-CRC file. A file that
// cannot be read (after `reader`'s retries) is not DataLoss but the
// reader's Unavailable "I/O error reading '<path>' ..." (see
// checkpoint_file_reader.h): the caller must not treat it as corruption.
absl::Status VerifyCheckpointFiles(
    const std::string& dir, const CheckpointMetadata& meta,
    VerifyMode mode = VerifyMode::kSizes,
    absl::Span<const std::string> only = {},
    const CheckpointFileReader& reader = CheckpointFileReader());

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_CHECKPOINT_METADATA_H_
