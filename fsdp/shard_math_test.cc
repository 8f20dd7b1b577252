#include "fsdp/shard_math.h"

#include <ATen/ATen.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::fsdp {
namespace {

using ::testing::ElementsAre;

// Oracle: ATen's own chunk.
std::vector<int64_t> TorchChunkSizes(int64_t size, int64_t n) {
  std::vector<int64_t> out(n, 0);
  auto pieces = at::arange(size).chunk(n, 0);
  for (size_t i = 0; i < pieces.size(); ++i) out[i] = pieces[i].numel();
  return out;
}

TEST(ShardMathTest, MatchesTorchChunk) {
  for (int64_t size = 0; size <= 13; ++size) {
    for (int64_t n = 1; n <= 5; ++n) {
      const std::vector<int64_t> expected = TorchChunkSizes(size, n);
      int64_t offset = 0;
      for (int64_t i = 0; i < n; ++i) {
        const ChunkExtent e = ChunkOf(size, n, i);
        EXPECT_EQ(e.size, expected[i]) << "size " << size << " n " << n << " i " << i;
        if (e.size > 0) {
          EXPECT_EQ(e.offset, offset);
        }
        offset += e.size;
      }
    }
  }
}

TEST(ShardMathTest, ExamplesFromTheHeader) {
  EXPECT_EQ(PaddedChunkSize(10, 4), 3);
  EXPECT_EQ(ChunkOf(10, 4, 3), (ChunkExtent{1, 9}));
  EXPECT_EQ(ChunkOf(5, 4, 3), (ChunkExtent{0, 5}));
  EXPECT_EQ(ChunkOf(2, 4, 2), (ChunkExtent{0, 2}));
  EXPECT_EQ(ChunkOf(0, 3, 0), (ChunkExtent{0, 0}));
}

TEST(ShardMathTest, NestedShardingAppliesInMeshDimOrder) {
  // (10, 6) on a 2x2 mesh, [S(0), S(0)]: chunk 10 by 2 -> 5, then 5 by 2 -> 3, 2.
  const std::vector<Placement> p = {Placement::Shard(0), Placement::Shard(0)};
  EXPECT_THAT(LocalShape({10, 6}, {2, 2}, {1, 1}, p), ElementsAre(2, 6));
  const auto ext = LocalExtents({10, 6}, {2, 2}, {1, 1}, p, 2);
  EXPECT_EQ(ext[0], (ChunkExtent{2, 8}));
  // [S(0), S(1)] with a replicate-free 2-d split.
  const std::vector<Placement> q = {Placement::Shard(1), Placement::Shard(0)};
  EXPECT_THAT(LocalShape({5, 7}, {2, 3}, {1, 2}, q), ElementsAre(1, 3));
  // Partial and Replicate keep the full size.
  const std::vector<Placement> r = {Placement::Partial(), Placement::Replicate()};
  EXPECT_THAT(LocalShape({5, 7}, {2, 3}, {1, 2}, r), ElementsAre(5, 7));
}

TEST(PlacementTest, NormalizeAndPrint) {
  auto p = NormalizePlacements({Placement::Shard(-1), Placement::Partial(ReduceOp::kMax)}, 3, 2);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(PlacementsToString(*p), "[S(2), P(max)]");
  EXPECT_FALSE(NormalizePlacements({Placement::Shard(3)}, 3, 1).ok());
  EXPECT_FALSE(NormalizePlacements({Placement::Replicate()}, 3, 2).ok());
  EXPECT_EQ(PlacementsToString(DefaultGradPlacements(*p)), "[S(2), R]");
}

}  // namespace
}  // namespace tpudist::fsdp
