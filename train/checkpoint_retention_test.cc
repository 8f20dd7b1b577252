#include "train/checkpoint_retention.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

namespace tpudist::train {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(CheckpointRetentionTest, KeepAllWhenUnset) {
  std::vector<RetentionCandidate> c = {{1, 3.0}, {2, 2.0}, {3, 1.0}};
  EXPECT_THAT(CheckpointsToDelete(c, 0, 3), IsEmpty());
  EXPECT_THAT(CheckpointsToDelete(c, -1, 3), IsEmpty());
}

TEST(CheckpointRetentionTest, KeepsBestByMinLoss) {
  std::vector<RetentionCandidate> c = {{1, 3.0}, {2, 1.0}, {3, 2.0}, {4, 1.5}};
  EXPECT_THAT(CheckpointsToDelete(c, 2, 4), ElementsAre(1, 3));
  EXPECT_THAT(CheckpointsToDelete(c, 1, 2), ElementsAre(1, 3, 4));
}

TEST(CheckpointRetentionTest, NeverDeletesTheLatest) {
  // The newest (5) is the worst; it survives alongside the best 2.
  std::vector<RetentionCandidate> c = {{1, 1.0}, {2, 2.0}, {3, 3.0},
                                       {5, 9.0}};
  EXPECT_THAT(CheckpointsToDelete(c, 2, 5), ElementsAre(3));
  // Once a newer one exists, the old worst latest goes.
  c = {{1, 1.0}, {2, 2.0}, {5, 9.0}, {6, 8.0}};
  EXPECT_THAT(CheckpointsToDelete(c, 2, 6), ElementsAre(5));
}

TEST(CheckpointRetentionTest, NaNIsWorstAndTiesPreferNewer) {
  std::vector<RetentionCandidate> c = {{1, kNaN}, {2, 5.0}, {3, kNaN}};
  EXPECT_THAT(CheckpointsToDelete(c, 1, 3), ElementsAre(1));
  c = {{1, 2.0}, {2, 2.0}, {3, 2.0}};
  EXPECT_THAT(CheckpointsToDelete(c, 1, 3), ElementsAre(1, 2));
  // Newer ranks first (3, 2); 1 would go but is the latest.
  EXPECT_THAT(CheckpointsToDelete(c, 2, 1), IsEmpty());
  EXPECT_TRUE(BetterCheckpoint({2, 1.0}, {1, 1.0}));
  EXPECT_TRUE(BetterCheckpoint({1, 1.0}, {2, kNaN}));
  EXPECT_FALSE(BetterCheckpoint({2, kNaN}, {1, 1.0}));
}

// Simulates a run's commits and checks the invariants at each step against
// a brute-force oracle: the kept set = best k by (loss, newer) + latest.
TEST(CheckpointRetentionTest, SimulatedRunMatchesOracle) {
  const double losses[] = {5, 4, 4.5, 3, 6, 3, 2.5, 7, 2, kNaN, 1};
  for (int k = 1; k <= 4; ++k) {
    std::vector<RetentionCandidate> alive;
    for (int64_t seq = 1; seq <= 11; ++seq) {
      alive.push_back({seq, losses[seq - 1]});
      const auto doomed = CheckpointsToDelete(alive, k, seq);
      std::vector<RetentionCandidate> next;
      for (const auto& c : alive) {
        if (!std::binary_search(doomed.begin(), doomed.end(), c.sequence)) {
          next.push_back(c);
        }
      }
      // Oracle.
      std::vector<RetentionCandidate> ranked = alive;
      std::sort(ranked.begin(), ranked.end(), BetterCheckpoint);
      std::set<int64_t> expect;
      for (size_t i = 0; i < ranked.size() && i < static_cast<size_t>(k); ++i)
        expect.insert(ranked[i].sequence);
      expect.insert(seq);
      std::set<int64_t> got;
      for (const auto& c : next) got.insert(c.sequence);
      ASSERT_EQ(got, expect) << "k=" << k << " seq=" << seq;
      ASSERT_LE(got.size(), static_cast<size_t>(k) + 1);
      alive = next;
    }
  }
}

}  // namespace
}  // namespace tpudist::train
