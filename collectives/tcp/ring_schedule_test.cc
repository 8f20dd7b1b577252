#include "collectives/tcp/ring_schedule.h"

#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace tpudist::collectives::tcp {
namespace {

TEST(RingRankTest, WrapsBothWays) {
  EXPECT_EQ(RingRank(0, 4, -1), 3);
  EXPECT_EQ(RingRank(3, 4, 1), 0);
  EXPECT_EQ(RingRank(1, 4, -9), 0);
  EXPECT_EQ(RingRank(2, 5, 13), 0);
  EXPECT_EQ(RingNext(4, 5), 0);
  EXPECT_EQ(RingPrev(0, 1), 0);
}

TEST(PartitionEvenTest, TilesAndBalances) {
  for (int64_t count : {0, 1, 7, 8, 13, 1000003}) {
    for (int parts : {1, 2, 3, 4, 8, 16}) {
      std::vector<Range> b = PartitionEven(count, parts);
      ASSERT_EQ(b.size(), static_cast<size_t>(parts));
      int64_t off = 0, lo = count, hi = 0;
      for (const Range& x : b) {
        EXPECT_EQ(x.begin, off);
        off += x.size;
        lo = std::min(lo, x.size);
        hi = std::max(hi, x.size);
      }
      EXPECT_EQ(off, count);
      EXPECT_LE(hi - lo, 1) << count << "/" << parts;
    }
  }
  EXPECT_EQ(PartitionEven(7, 3)[0], (Range{0, 3}));
  EXPECT_EQ(PartitionEven(7, 3)[2], (Range{5, 2}));
}

TEST(BlocksFromLengthsTest, PrefixSums) {
  std::vector<size_t> lengths = {3, 0, 5, 1};
  std::vector<Range> b = BlocksFromLengths(lengths);
  EXPECT_EQ(b[0], (Range{0, 3}));
  EXPECT_EQ(b[1], (Range{3, 0}));
  EXPECT_EQ(b[2], (Range{3, 5}));
  EXPECT_EQ(b[3], (Range{8, 1}));
  EXPECT_EQ(TotalLength(lengths), 9u);
}

TEST(NumSegmentsTest, BoundsSegmentBytes) {
  EXPECT_EQ(NumSegments(0, 4, 1 << 20), 1u);
  EXPECT_EQ(NumSegments(1, 4, 1 << 20), 1u);
  EXPECT_EQ(NumSegments(262144, 4, 1 << 20), 1u);  // exactly 1 MiB
  EXPECT_EQ(NumSegments(262145, 4, 1 << 20), 2u);
  EXPECT_EQ(NumSegments(10, 8, 4), 10u);  // at least one element per segment
  for (size_t len : {1u, 5u, 1000u, 262145u, 4000037u}) {
    for (size_t max_bytes : {16u, 4096u, 1u << 20}) {
      size_t n = NumSegments(len, 4, max_bytes);
      Range block{17, static_cast<int64_t>(len)};
      int64_t off = 17;
      for (size_t k = 0; k < n; ++k) {
        Range s = SegmentOf(block, k, n);
        EXPECT_EQ(s.begin, off);
        EXPECT_LE(s.size * 4, std::max<int64_t>(max_bytes, 4));
        off += s.size;
      }
      EXPECT_EQ(off, block.end());
    }
  }
}

// Simulates the reduce-scatter schedule symbolically: each rank tracks which
// ranks' contributions each of its blocks contains. At the end rank r's block
// r must contain every rank, and each step must receive exactly what the
// predecessor sends.
TEST(RingScheduleTest, ReduceScatterEndsWithOwnBlockComplete) {
  for (int w : {1, 2, 3, 4, 5, 8, 16}) {
    std::vector<std::vector<std::set<int>>> have(w, std::vector<std::set<int>>(w));
    for (int r = 0; r < w; ++r)
      for (int b = 0; b < w; ++b) have[r][b] = {r};
    for (int step = 0; step < w - 1; ++step) {
      auto before = have;
      for (int r = 0; r < w; ++r) {
        int prev = RingPrev(r, w);
        ASSERT_EQ(RsSendBlock(prev, w, step), RsRecvBlock(r, w, step));
        int b = RsRecvBlock(r, w, step);
        for (int c : before[prev][b]) have[r][b].insert(c);
      }
    }
    for (int r = 0; r < w; ++r) EXPECT_EQ(have[r][r].size(), static_cast<size_t>(w)) << w;
  }
}

TEST(RingScheduleTest, AllGatherDeliversEveryBlock) {
  for (int w : {1, 2, 3, 4, 7, 8}) {
    std::vector<std::set<int>> have(w);
    for (int r = 0; r < w; ++r) have[r] = {r};
    for (int step = 0; step < w - 1; ++step) {
      auto before = have;
      for (int r = 0; r < w; ++r) {
        int prev = RingPrev(r, w);
        ASSERT_EQ(AgSendBlock(prev, w, step), AgRecvBlock(r, w, step));
        ASSERT_TRUE(before[prev].count(AgSendBlock(prev, w, step))) << "sends a block it lacks";
        have[r].insert(AgRecvBlock(r, w, step));
      }
    }
    for (int r = 0; r < w; ++r) EXPECT_EQ(have[r].size(), static_cast<size_t>(w));
  }
}

TEST(RingScheduleTest, AllToAllPairsMeetOnce) {
  for (int w : {2, 3, 4, 6}) {
    std::set<std::pair<int, int>> seen;
    for (int step = 1; step < w; ++step) {
      for (int r = 0; r < w; ++r) {
        int to = AllToAllSendPeer(r, w, step);
        EXPECT_EQ(AllToAllRecvPeer(to, w, step), r);
        EXPECT_TRUE(seen.insert({r, to}).second);
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(w * (w - 1)));
  }
}

TEST(RingScheduleTest, ChainPosition) {
  EXPECT_EQ(ChainPosition(2, 4, 2), 0);
  EXPECT_EQ(ChainPosition(1, 4, 2), 3);
  EXPECT_EQ(ChainPosition(0, 4, 2), 2);
}

}  // namespace
}  // namespace tpudist::collectives::tcp
