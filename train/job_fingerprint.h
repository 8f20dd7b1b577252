// JobFingerprint: what makes a fine-tune run the run it is, recorded in
// every checkpoint.json ("job") so that a later attempt resumes only into
// the same job (resume_plan.h).
//
// Fields (name -> canonical text; doubles in shortest round-trip form):
//
//   model/<file>            "bytes=N crc32=xxxxxxxx" for every top-level file
//                           of --model-dir ending in .json, .safetensors or
//                           .model: config, initial weights, tokenizer
//   dataset                 "bytes=N crc32=xxxxxxxx" of the JSONL's contents
//                           (its path is not part of the job: a moved file
//                           is the same data)
//   dataset_split           "train[:1024]"
//   dataset_rows            rows after the split
//   include_context         "true" / "false"
//   max_seq_len, batch_size_per_device, num_epochs, lr, weight_decay, seed,
//   bf16, world_size        the hyper-parameters and the job shape
//   tensor_parallel         --tp, only when > 1 (so checkpoints written
//                           before --tp existed still match a --tp 1 run):
//                           each rank's optimizer state is its (dp, tp) piece
//
// Not in it: storage path, run name, --num-to-keep, --max-failures,
// --timeout, failure injection: they do not change what is trained.
//
// ComputeJobFingerprint reads files (each once, streaming: ~3 GB/s of CRC
// plus the read); the rest is pure. Thread-safe.
#ifndef TPU_DIST_TRAIN_JOB_FINGERPRINT_H_
#define TPU_DIST_TRAIN_JOB_FINGERPRINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tpudist::train {

// Field name -> canonical value; ordered so it prints and compares stably.
using JobFingerprint = std::map<std::string, std::string>;

// The inputs a fingerprint is computed from (gemma_finetune's flags, the
// loaded data's row count, the job's world size).
struct JobSpec {
  std::string model_dir;
  std::string dataset;  // JSONL path
  std::string dataset_split;
  int64_t dataset_rows = 0;
  bool include_context = false;
  int64_t max_seq_len = 0;
  int64_t batch_size_per_device = 0;
  int64_t num_epochs = 0;
  double lr = 0.0;
  double weight_decay = 0.0;
  uint64_t seed = 0;
  bool bf16 = true;
  int world_size = 1;
  int64_t tensor_parallel = 1;
};

// Reads the model and data files' digests; errors name the file. A model
// directory without any matching file is InvalidArgument.
absl::StatusOr<JobFingerprint> ComputeJobFingerprint(const JobSpec& spec);

// One line per field that differs, in field order, e.g.
//   "lr: 0.003 in the checkpoint, 0.001 now"
//   "model/tokenizer.json: absent in the checkpoint, bytes=.. crc32=.. now"
// Empty when they match. Pure.
std::vector<std::string> FingerprintDifferences(const JobFingerprint& recorded,
                                                const JobFingerprint& current);

// Shortest text that parses back to exactly `v` ("0.003", "2e-05"). Pure.
std::string CanonicalDouble(double v);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_JOB_FINGERPRINT_H_
