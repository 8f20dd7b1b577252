#include "train/checkpoint_retention.h"

#include <algorithm>
#include <cmath>

namespace tpudist::train {

bool BetterCheckpoint(const RetentionCandidate& a,
                      const RetentionCandidate& b) {
  const bool a_nan = std::isnan(a.loss);
  const bool b_nan = std::isnan(b.loss);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a.loss != b.loss) return a.loss < b.loss;
  return a.sequence > b.sequence;
}

std::vector<int64_t> CheckpointsToDelete(
    absl::Span<const RetentionCandidate> candidates, int num_to_keep,
    int64_t latest_sequence) {
  std::vector<int64_t> out;
  if (num_to_keep <= 0) return out;
  std::vector<RetentionCandidate> ranked(candidates.begin(), candidates.end());
  std::sort(ranked.begin(), ranked.end(), BetterCheckpoint);
  for (size_t i = static_cast<size_t>(num_to_keep); i < ranked.size(); ++i) {
    if (ranked[i].sequence != latest_sequence) {
      out.push_back(ranked[i].sequence);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tpudist::train
