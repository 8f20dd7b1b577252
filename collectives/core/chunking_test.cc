#include "collectives/core/chunking.h"

#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

TEST(ChunkingTest, NumChunks) {
  EXPECT_EQ(NumChunks(0, 4), 0);
  EXPECT_EQ(NumChunks(1, 4), 1);
  EXPECT_EQ(NumChunks(4, 4), 1);
  EXPECT_EQ(NumChunks(5, 4), 2);
  EXPECT_EQ(NumChunks(17, 1), 17);
}

TEST(ChunkingTest, ChunkRangesTileTheBuffer) {
  for (int64_t total : {1, 7, 16, 97}) {
    for (int64_t chunk : {1, 3, 16, 100}) {
      int64_t next = 0;
      for (int64_t i = 0; i < NumChunks(total, chunk); ++i) {
        const Range r = ChunkRange(total, chunk, i);
        EXPECT_EQ(r.begin, next);
        EXPECT_GT(r.size, 0);
        EXPECT_LE(r.size, chunk);
        next = r.end();
      }
      EXPECT_EQ(next, total) << total << " " << chunk;
    }
  }
  EXPECT_EQ(ChunkRange(10, 4, 2), (Range{8, 2}));
}

TEST(ChunkingTest, EvenSliceBalancedAndTiling) {
  EXPECT_EQ(EvenSlice(10, 3, 0), (Range{0, 4}));
  EXPECT_EQ(EvenSlice(10, 3, 1), (Range{4, 3}));
  EXPECT_EQ(EvenSlice(10, 3, 2), (Range{7, 3}));
  EXPECT_EQ(EvenSlice(2, 4, 3), (Range{2, 0}));
  for (int64_t total : {0, 1, 13, 64, 1009}) {
    for (int parts : {1, 2, 3, 8, 16}) {
      int64_t next = 0, lo = total, hi = 0;
      for (int i = 0; i < parts; ++i) {
        const Range r = EvenSlice(total, parts, i);
        EXPECT_EQ(r.begin, next);
        next = r.end();
        lo = std::min(lo, r.size);
        hi = std::max(hi, r.size);
      }
      EXPECT_EQ(next, total);
      EXPECT_LE(hi - lo, 1);
    }
  }
}

TEST(ChunkingTest, TorchChunkSizesMatchTorchChunk) {
  // torch.chunk(arange(10), 4) -> sizes 3,3,3,1
  EXPECT_THAT(TorchChunkSizes(10, 4), testing::ElementsAre(3, 3, 3, 1));
  // torch.chunk(arange(5), 4) -> sizes 2,2,1 (only three pieces)
  EXPECT_THAT(TorchChunkSizes(5, 4), testing::ElementsAre(2, 2, 1, 0));
  // torch.chunk(arange(6), 4) -> sizes 2,2,2
  EXPECT_THAT(TorchChunkSizes(6, 4), testing::ElementsAre(2, 2, 2, 0));
  EXPECT_THAT(TorchChunkSizes(0, 3), testing::ElementsAre(0, 0, 0));
  EXPECT_THAT(TorchChunkSizes(1, 1), testing::ElementsAre(1));
  for (int64_t total : {1, 7, 31, 100}) {
    for (int chunks : {1, 2, 3, 5, 8}) {
      const auto s = TorchChunkSizes(total, chunks);
      EXPECT_EQ(std::accumulate(s.begin(), s.end(), int64_t{0}), total);
    }
  }
}

// The chunk and the largest slice of it fit the slot, the result area is
// 64-aligned past the chunk, and one more element would not fit.
TEST(ChunkingTest, PipelinedAllReduceLayoutFitsAndIsTight) {
  auto need = [](int64_t c, int64_t es, int world) {
    return ((c * es + 63) & ~int64_t{63}) + (c + world - 1) / world * es;
  };
  for (int64_t slot : {128, 4096, 4100, 262144, 2 << 20}) {
    for (int64_t es : {1, 2, 4, 8}) {
      for (int world : {1, 2, 3, 16, 64}) {
        if (slot < 64 * world) continue;  // not a valid slot for this world
        const PipelinedLayout l = PipelinedAllReduceLayout(slot, es, world);
        SCOPED_TRACE(::testing::Message() << slot << " B, es " << es << ", world " << world);
        ASSERT_GE(l.chunk_elems, 1);
        EXPECT_EQ(l.result_offset % 64, 0);
        EXPECT_GE(l.result_offset, l.chunk_elems * es);
        EXPECT_LE(need(l.chunk_elems, es, world), slot);
        EXPECT_GT(need(l.chunk_elems + 1, es, world), slot);
      }
    }
  }
  // 2 MiB fp32 slots at 16 ranks: chunks of ~16/17 of the slot.
  EXPECT_EQ(PipelinedAllReduceLayout(2 << 20, 4, 16).chunk_elems, 493440);
}

TEST(ChunkingTest, AllReducePhaseBytesIsTheSlotUpToTheCap) {
  EXPECT_EQ(AllReducePhaseBytes(2 << 20, 16), 512 << 10);   // 2 MiB slots (ranks > cores)
  EXPECT_EQ(AllReducePhaseBytes(2 << 20, 4), 512 << 10);
  EXPECT_EQ(AllReducePhaseBytes(256 << 10, 2), 256 << 10);  // the slot when smaller
  EXPECT_EQ(AllReducePhaseBytes(256 << 10, 64), 256 << 10);
  EXPECT_EQ(AllReducePhaseBytes(4096, 16), 4096);           // tiny test slots
}

TEST(ChunkingTest, ExclusiveOffsets) {
  const std::vector<int64_t> sizes = {3, 0, 5, 1};
  EXPECT_THAT(ExclusiveOffsets(sizes), testing::ElementsAre(0, 3, 3, 8));
  EXPECT_TRUE(ExclusiveOffsets({}).empty());
}

TEST(ChunkingTest, ResolveSplits) {
  EXPECT_THAT(*ResolveSplits({}, 8, 4, "input"), testing::ElementsAre(2, 2, 2, 2));
  EXPECT_THAT(*ResolveSplits({0}, 0, 1, "input"), testing::ElementsAre(0));
  const std::vector<int64_t> uneven = {1, 0, 4};
  EXPECT_THAT(*ResolveSplits(uneven, 5, 3, "input"), testing::ElementsAre(1, 0, 4));
  EXPECT_FALSE(ResolveSplits({}, 7, 4, "input").ok());
  EXPECT_FALSE(ResolveSplits(uneven, 6, 3, "output").ok());
  const std::vector<int64_t> negative = {-1, 6};
  EXPECT_FALSE(ResolveSplits(negative, 5, 2, "input").ok());
  EXPECT_FALSE(ResolveSplits(uneven, 5, 2, "input").ok());
  EXPECT_THAT(std::string(ResolveSplits({}, 7, 4, "output").status().message()),
              testing::HasSubstr("output"));
}

TEST(ChunkingTest, AlltoallPhases) {
  // 2x2 matrix of bytes, capacity 10 per pair per phase.
  EXPECT_EQ(AlltoallPhases({0, 0, 0, 0}, 2, 10), 1);
  EXPECT_EQ(AlltoallPhases({10, 0, 0, 0}, 2, 10), 1);
  EXPECT_EQ(AlltoallPhases({10, 11, 0, 25}, 2, 10), 3);
}

}  // namespace
}  // namespace tpudist::collectives
