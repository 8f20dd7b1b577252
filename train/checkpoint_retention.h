// Which checkpoints to prune: Ray Train's CheckpointConfig semantics with
// checkpoint_score_attribute="loss", checkpoint_score_order="min".
//
//   - num_to_keep <= 0 keeps everything (Ray: num_to_keep=None).
//   - Otherwise the num_to_keep checkpoints with the lowest loss are kept,
//     and so is the most recent one (latest_sequence) even when it is worse:
//     a run must always be able to resume from where it stopped. That
//     latest one is pruned by a later call once a newer checkpoint exists
//     and it is still outside the best num_to_keep. So at most
//     num_to_keep + 1 checkpoints exist at a time.
//   - A NaN loss ranks below every number. Equal losses rank the newer
//     checkpoint (higher sequence) higher, as Ray inserts a new result after
//     equal-scored ones.
//
// Pure function; no I/O.
#ifndef TPU_DIST_TRAIN_CHECKPOINT_RETENTION_H_
#define TPU_DIST_TRAIN_CHECKPOINT_RETENTION_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace tpudist::train {

struct RetentionCandidate {
  int64_t sequence = 0;  // commit order, unique, higher = newer
  double loss = 0.0;
};

// Sequences of the candidates to delete, ascending. `latest_sequence` is
// never among them.
std::vector<int64_t> CheckpointsToDelete(
    absl::Span<const RetentionCandidate> candidates, int num_to_keep,
    int64_t latest_sequence);

// True when a ranks strictly better than b under the rules above.
bool BetterCheckpoint(const RetentionCandidate& a, const RetentionCandidate& b);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_CHECKPOINT_RETENTION_H_
