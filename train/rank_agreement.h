// CheckRanksAgree: every rank of a fine-tune must train the same job. A rank
// started with another --model-dir, dataset or hyper-parameter would
// otherwise train a model mixed from both (its weights and batches enter the
// same all-reduces). Each rank computes its own JobFingerprint
// (job_fingerprint.h); rank 0 publishes its own, every other rank compares
// with it and fails, naming each differing field with both values, e.g.
//
//   rank 3 was started for another job than rank 0:
//   model/config.json: bytes=812 crc32=1a2b3c4d on rank 0, bytes=815
//   crc32=99aa0011 on rank 3
//
// Reported through the coordination service (failure_report.h), the
// mismatch fails every rank within milliseconds of rank 3's check.
//
// Collective over `store` (all ranks call it); blocks at most `timeout`.
// Thread-safety: call from the rank's main thread.
#ifndef TPU_DIST_TRAIN_RANK_AGREEMENT_H_
#define TPU_DIST_TRAIN_RANK_AGREEMENT_H_

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "train/job_fingerprint.h"

namespace tpudist::train {

// One line per field that differs between rank 0's fingerprint and `rank`'s
// ("<field>: <v0> on rank 0, <v> on rank <rank>"; "absent" for a missing
// field). Empty when they match. Pure.
std::vector<std::string> RankDifferences(const JobFingerprint& rank0, const JobFingerprint& mine,
                                         int rank);

// See the file comment. FailedPrecondition on a mismatch; the store's error
// (e.g. the job error, or a timeout) when rank 0 never published.
absl::Status CheckRanksAgree(c10d::Store& store, int rank, const JobFingerprint& mine,
                             absl::Duration timeout);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_RANK_AGREEMENT_H_
