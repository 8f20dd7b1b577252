// checkpoint.json: the small record that makes a checkpoint directory
// complete. It is the last thing written into a checkpoint (see
// checkpoint_manager.h), so its presence, "complete": true and files that
// match its sizes and CRC-32s are what a reader trusts.
//
//   {"format": 2, "sequence": 4, "epoch": 2, "step": 128, "loss": 1.9321,
//    "complete": true, "created": "2026-12-02T13:45:05.123456+00:00",
//    "job": {"lr": "0.003", "seed": "5", ...},        job_fingerprint.h
//    "files": [{"path": "model.pt", "bytes": 10485760, "crc32": "0a1b2c3d"},
//              {"path": "shards/rank_1.pt", "bytes": 4096, "crc32": ...}]}
//
// A NaN loss is written as null (JSON has no NaN) and read back as NaN.
// Format 1 (sizes only, no job) is refused as unverifiable. The CRC-32 is
// zlib's (file_checksum.h says why).
// Plain values; pure functions except VerifyCheckpointFiles (reads files).
#ifndef EXAMPLES_FINETUNE_CHECKPOINT_METADATA_H_
#define EXAMPLES_FINETUNE_CHECKPOINT_METADATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "examples/finetune/job_fingerprint.h"

namespace tpudist::finetune {

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
};

// One JSON document (with trailing newline).
std::string CheckpointMetadataToJson(const CheckpointMetadata& meta);

// Parses a checkpoint.json body; `path` names it in errors (DataLoss).
absl::StatusOr<CheckpointMetadata> ParseCheckpointMetadata(
    absl::string_view json, absl::string_view path);

enum class VerifyMode {
  kSizes,      // stat only: cheap, catches truncation and deletion
  kChecksums,  // reads every byte: also catches bytes overwritten in place
};

// Checks that every listed file exists under `dir` with its recorded size
// (and, for kChecksums, CRC-32). With a non-empty `only`, checks just those
// relative paths, each of which must be listed. DataLoss naming the file
// and both values otherwise.
absl::Status VerifyCheckpointFiles(const std::string& dir,
                                   const CheckpointMetadata& meta,
                                   VerifyMode mode = VerifyMode::kSizes,
                                   absl::Span<const std::string> only = {});

}  // namespace tpudist::finetune

#endif  // EXAMPLES_FINETUNE_CHECKPOINT_METADATA_H_
