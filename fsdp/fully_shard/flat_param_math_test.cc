#include "fsdp/fully_shard/flat_param_math.h"

#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include "fsdp/fully_shard/flat_buffer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::fsdp {
namespace {

using ::testing::ElementsAre;

TEST(FlatParamMathTest, OffsetsAndPadding) {
  // [10, 3] over 4: rows 3,3,3,1 padded to 3 -> 9 elements; [5] -> 2 padded.
  auto layout = MakeFlatParamLayout({{10, 3}, {5}, {2, 2, 2}}, 4);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->entries.size(), 3u);
  EXPECT_EQ(layout->entries[0].padded_rows, 3);
  EXPECT_EQ(layout->entries[0].padded_numel, 9);
  EXPECT_EQ(layout->entries[0].offset, 0);
  EXPECT_EQ(layout->entries[1].padded_numel, 2);
  EXPECT_EQ(layout->entries[1].offset, 9);
  EXPECT_EQ(layout->entries[2].row_numel, 4);
  EXPECT_EQ(layout->entries[2].padded_numel, 4);
  EXPECT_EQ(layout->entries[2].offset, 11);
  EXPECT_EQ(layout->shard_numel, 15);
  EXPECT_THAT(ShardShape(layout->entries[0], 4, 3), ElementsAre(1, 3));
  EXPECT_THAT(ShardShape(layout->entries[2], 4, 2), ElementsAre(0, 2, 2));  // empty tail
  EXPECT_EQ(ShardRows(layout->entries[1], 4, 2).offset, 4);
}

TEST(FlatParamMathTest, RejectsBadInput) {
  EXPECT_FALSE(MakeFlatParamLayout({{}}, 2).ok());
  EXPECT_FALSE(MakeFlatParamLayout({{3, -1}}, 2).ok());
  EXPECT_FALSE(MakeFlatParamLayout({{3}}, 0).ok());
  auto empty = MakeFlatParamLayout({}, 3);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->shard_numel, 0);
}

TEST(FlatParamMathTest, Intersect) {
  EXPECT_EQ(Intersect({0, 5}, {3, 9}).size(), 2);
  EXPECT_EQ(Intersect({0, 5}, {3, 9}).begin, 3);
  EXPECT_EQ(Intersect({0, 3}, {3, 9}).size(), 0);
  EXPECT_EQ(Intersect({4, 4}, {0, 9}).size(), 0);
}

// Oracle: torch.chunk of each tensor; an all-gather is the concatenation of
// every rank's flat shard; a reduce-scatter of identical inputs returns rank
// r's region.
TEST(FlatBufferTest, ShardGatherScatterRoundTripMatchesChunk) {
  for (int64_t w : {1, 2, 3, 4, 7}) {
    std::vector<at::Tensor> full = {at::randn({10, 3}), at::randn({5}), at::randn({2, 2, 2}),
                                    at::randn({0, 4})};
    std::vector<std::vector<int64_t>> shapes;
    for (const auto& t : full) shapes.push_back(t.sizes().vec());
    auto layout = MakeFlatParamLayout(shapes, w);
    ASSERT_TRUE(layout.ok());
    std::vector<at::Tensor> flats;
    for (int64_t r = 0; r < w; ++r) {
      flats.push_back(MakeFlatShard(full, *layout, r, at::kFloat));
      for (size_t i = 0; i < full.size(); ++i) {
        auto chunks = full[i].chunk(w, 0);
        at::Tensor expect = r < static_cast<int64_t>(chunks.size())
                                ? chunks[r]
                                : full[i].narrow(0, full[i].size(0), 0);
        at::Tensor got = ShardView(flats[r], *layout, i, r);
        EXPECT_EQ(got.sizes(), expect.sizes()) << "w " << w << " r " << r << " i " << i;
        EXPECT_TRUE(at::equal(got, expect));
      }
    }
    std::vector<at::Tensor> back = UnpackAllGather(at::cat(flats), *layout);
    for (size_t i = 0; i < full.size(); ++i) EXPECT_TRUE(at::equal(back[i], full[i])) << w;
    // Contiguous and same dtype: one memcpy per (parameter, rank) block;
    // strided or another dtype: TensorIterator copies. All must agree.
    const at::Tensor gathered = at::cat(flats);
    const at::Tensor strided_gathered = at::stack({gathered, -gathered}, 1).select(1, 0);
    ASSERT_FALSE(strided_gathered.is_contiguous());
    std::vector<at::Tensor> back2 = UnpackAllGather(strided_gathered, *layout);
    for (size_t i = 0; i < full.size(); ++i) EXPECT_TRUE(at::equal(back2[i], full[i])) << w;
    std::vector<at::Tensor> strided_full;
    for (const at::Tensor& t : full) {
      strided_full.push_back(t.dim() == 2 ? t.t().contiguous().t() : t);
    }
    ASSERT_FALSE(strided_full[0].is_contiguous());
    for (const auto& grads : {full, strided_full}) {
      at::Tensor rs = PackReduceScatterInput(grads, *layout, at::kDouble).view({w, -1});
      at::Tensor rs32 = PackReduceScatterInput(grads, *layout, at::kFloat).view({w, -1});
      for (int64_t r = 0; r < w; ++r) {
        EXPECT_TRUE(at::equal(rs[r], flats[r].to(at::kDouble))) << "w " << w << " r " << r;
        EXPECT_TRUE(at::equal(rs32[r], flats[r])) << "w " << w << " r " << r;
      }
    }
  }
}

// A grad aliasing the flat grad buffer: same values as the view, shared
// storage, and torch::optim's zero_grad (detach_, then reset) accepts it.
TEST(FlatBufferTest, AliasShardSharesStorageAndSurvivesZeroGrad) {
  auto layout = MakeFlatParamLayout({{5, 3}, {4}, {0, 2}}, 2);
  ASSERT_TRUE(layout.ok());
  at::Tensor flat = at::arange(layout->shard_numel, at::kFloat);
  for (int64_t r = 0; r < 2; ++r) {
    for (size_t i = 0; i < layout->entries.size(); ++i) {
      at::Tensor a = AliasShard(flat, *layout, i, r), v = ShardView(flat, *layout, i, r);
      EXPECT_EQ(a.sizes(), v.sizes());
      EXPECT_TRUE(at::equal(a, v)) << r << " " << i;
      if (a.numel() > 0) {
        EXPECT_EQ(a.data_ptr(), v.data_ptr());
      }
      EXPECT_FALSE(a.is_view());
    }
  }
  at::Tensor p = at::zeros({3, 3}).requires_grad_();
  p.mutable_grad() = AliasShard(flat, *layout, 0, 0);
  torch::optim::SGD sgd({p}, 0.1);
  sgd.zero_grad();
  EXPECT_FALSE(p.grad().defined());
}

}  // namespace
}  // namespace tpudist::fsdp
