// Block math, metadata.json parsing (formats 1 and 2) and the global layout
// records of fsdp/global_layout.h.
#include "fsdp/fully_shard/shard_blocks.h"

#include <string>

#include <torch/torch.h>

#include "fsdp/global_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::fsdp {
namespace {

using ::testing::HasSubstr;

TEST(BlockTest, IntersectIsTheOverlapInEveryDim) {
  const Block a{{2, 0}, {4, 6}}, b{{4, 3}, {5, 5}};
  EXPECT_EQ(IntersectBlocks(a, b), (Block{{4, 3}, {2, 3}}));
  EXPECT_EQ(IntersectBlocks(a, b).numel(), 6);
  EXPECT_EQ(IntersectBlocks(a, Block{{6, 0}, {1, 6}}).numel(), 0);  // touching rows
  EXPECT_EQ(IntersectBlocks(a, Block{{2, 6}, {4, 1}}).numel(), 0);  // disjoint in dim 1 only
  EXPECT_EQ(WholeBlock({3, 4}), (Block{{0, 0}, {3, 4}}));
}

// Format 1 (no "format"): torch.chunk rows per rank, uneven and with an
// empty tail, as the old writer assumed; unsharded tensors whole on rank 0.
TEST(ShardedCheckpointMetadataTest, FormatOneBecomesChunkRows) {
  const nlohmann::json j = nlohmann::json::parse(R"({"world_size": 4, "tensors": {
      "w": {"shape": [9, 2], "dtype": "Float", "sharded": true},
      "v": {"shape": [3], "dtype": "Float", "sharded": true},
      "b": {"shape": [5], "dtype": "Float", "sharded": false}}})");
  absl::StatusOr<ShardedCheckpointMetadata> m = ParseShardedCheckpointMetadata(j, "x/metadata.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->world_size, 4);
  const auto& w = m->tensors.at("w").blocks;
  ASSERT_EQ(w.size(), 4u);
  const auto chunks = torch::arange(9).chunk(4, 0);  // torch's own split: 3, 3, 3
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(w[r].rank, r);
    const int64_t rows = r < static_cast<int>(chunks.size()) ? chunks[r].size(0) : 0;
    EXPECT_EQ(w[r].block.sizes, (std::vector<int64_t>{rows, 2})) << r;
    if (rows > 0) {
      EXPECT_EQ(w[r].block.offsets[0], chunks[r][0].item<int64_t>()) << r;
    }
  }
  const auto& v = m->tensors.at("v").blocks;  // 3 rows over 4: 1, 1, 1, 0
  EXPECT_EQ(v[3].block.sizes, (std::vector<int64_t>{0}));
  ASSERT_EQ(m->tensors.at("b").blocks.size(), 1u);
  EXPECT_EQ(m->tensors.at("b").blocks[0].block, WholeBlock({5}));
}

TEST(ShardedCheckpointMetadataTest, FormatTwoRoundTrips) {
  ShardedCheckpointMetadata m;
  m.world_size = 4;
  m.tensors["w"] = TensorBlocks{{4, 6}, "Float",
                                {{0, {{0, 0}, {2, 3}}}, {1, {{0, 3}, {2, 3}}}, {2, {{2, 0}, {2, 3}}},
                                 {3, {{2, 3}, {2, 3}}}}};
  const nlohmann::json j = ShardedCheckpointMetadataToJson(m);
  EXPECT_EQ(j["format"], 2);
  absl::StatusOr<ShardedCheckpointMetadata> back = ParseShardedCheckpointMetadata(j, "m.json");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->tensors.at("w").blocks.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(back->tensors.at("w").blocks[r].rank, m.tensors["w"].blocks[r].rank);
    EXPECT_EQ(back->tensors.at("w").blocks[r].block, m.tensors["w"].blocks[r].block);
  }
}

// Each corruption is DataLoss naming the file and the tensor.
TEST(ShardedCheckpointMetadataTest, CorruptBlocksAreErrorsNamingTheTensor) {
  const std::string good = R"({"format": 2, "world_size": 2, "tensors": {"layer.w": {"shape": [4, 2],
      "dtype": "Float", "blocks": [{"rank": 0, "offsets": [0, 0], "sizes": [2, 2]},
                                   {"rank": 1, "offsets": [2, 0], "sizes": [2, 2]}]}}})";
  ASSERT_TRUE(ParseShardedCheckpointMetadata(nlohmann::json::parse(good), "d/metadata.json").ok());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("offsets": [2, 0], "sizes": [2, 2])", R"("offsets": [1, 0], "sizes": [2, 2])"},  // overlap
      {R"("offsets": [2, 0], "sizes": [2, 2])", R"("offsets": [2, 0], "sizes": [1, 2])"},  // gap
      {R"("offsets": [2, 0], "sizes": [2, 2])", R"("offsets": [3, 0], "sizes": [2, 2])"},  // past the end
      {R"("offsets": [2, 0], "sizes": [2, 2])", R"("offsets": [2], "sizes": [2])"},        // ndim
      {R"({"rank": 1,)", R"({"rank": 2,)"},                                                // no such rank
      {R"("offsets": [2, 0], "sizes": [2, 2])", R"("offsets": [2, 0], "sizes": "2x2")"},   // malformed
  };
  for (const auto& [from, to] : cases) {
    std::string text = good;
    text.replace(text.find(from), from.size(), to);
    absl::StatusOr<ShardedCheckpointMetadata> m =
        ParseShardedCheckpointMetadata(nlohmann::json::parse(text), "d/metadata.json");
    ASSERT_FALSE(m.ok()) << to;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << m.status();
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("layer.w")) << m.status();
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("d/metadata.json")) << m.status();
  }
  nlohmann::json newer = nlohmann::json::parse(good);
  newer["format"] = 3;
  EXPECT_EQ(ParseShardedCheckpointMetadata(newer, "d").status().code(), absl::StatusCode::kUnimplemented);
}

TEST(GlobalLayoutTest, SetGetClearAndValidation) {
  at::Tensor p = torch::zeros({2, 3});
  EXPECT_FALSE(GetGlobalLayout(p).has_value());
  ASSERT_TRUE(SetGlobalLayout(p, {4, 3}, {2, 0}).ok());
  std::optional<GlobalLayout> g = GetGlobalLayout(p);
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(*g, (GlobalLayout{{4, 3}, {2, 0}, {2, 3}}));
  at::Tensor alias = p;  // same TensorImpl
  EXPECT_TRUE(GetGlobalLayout(alias).has_value());
  p.set_data(torch::ones({1}));  // set_data keeps the TensorImpl, so the record
  EXPECT_TRUE(GetGlobalLayout(p).has_value());
  EXPECT_FALSE(GetGlobalLayout(torch::zeros({2, 3})).has_value());
  ClearGlobalLayout(p);
  EXPECT_FALSE(GetGlobalLayout(p).has_value());

  at::Tensor q = torch::zeros({2, 3});
  EXPECT_EQ(SetGlobalLayout(q, {4, 3}, {3, 0}).code(), absl::StatusCode::kInvalidArgument);  // 3 + 2 > 4
  EXPECT_EQ(SetGlobalLayout(q, {4, 3}, {-1, 0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SetGlobalLayout(q, {4}, {0}).code(), absl::StatusCode::kInvalidArgument);  // ndim
  EXPECT_EQ(SetGlobalLayout(at::Tensor(), {4}, {0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(GetGlobalLayout(q).has_value());
}

}  // namespace
}  // namespace tpudist::fsdp
