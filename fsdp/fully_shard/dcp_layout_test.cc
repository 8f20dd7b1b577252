// dcp_layout.h: torch's file names and header records, and the index a
// reader builds (what torch's HuggingFaceStorageReader.read_metadata does,
// plus the consistency checks it leaves out).
#include "fsdp/fully_shard/dcp_layout.h"

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::fsdp {
namespace {

using ::testing::HasSubstr;

io::SafetensorsEntry Entry(std::vector<int64_t> shape, std::string dtype = "F32") {
  return io::SafetensorsEntry{std::move(dtype), std::move(shape), 0, 0};
}

DcpFileView File(std::string path, std::map<std::string, io::SafetensorsEntry> entries,
                 std::vector<std::pair<std::string, std::vector<int64_t>>> offsets) {
  return DcpFileView{std::move(path), std::move(entries), DcpFileMetadata(offsets)};
}

TEST(DcpLayoutTest, FileNamesAreTorchs) {
  // torch's _gen_file_name(1, 1, shard_index=rank + 1).
  EXPECT_EQ(DcpShardFileName(0), "shard-00001-model-00001-of-00001.safetensors");
  EXPECT_EQ(DcpShardFileName(15), "shard-00016-model-00001-of-00001.safetensors");
}

TEST(DcpLayoutTest, MetadataRecordsOffsetsAsTorchDoes) {
  auto md = DcpFileMetadata({{"w", {4, 0}}, {"optim.state.w.step", {}}});
  EXPECT_EQ(md.at("DCP_VERSION"), "1.0");
  EXPECT_EQ(md.at("format"), "pt");
  const nlohmann::json info = nlohmann::json::parse(md.at(kDcpShardingInfoKey));
  EXPECT_EQ(info["w"]["saved_offsets"], nlohmann::json({4, 0}));
  EXPECT_EQ(info["optim.state.w.step"]["saved_offsets"], nlohmann::json::array());
}

TEST(DcpLayoutTest, IndexTilesUnevenShardsAndEmptyOnes) {
  // 3 rows over 4 ranks: 1, 1, 1, 0 (the empty one at torch's offset 3).
  std::vector<DcpFileView> files;
  for (int64_t r = 0; r < 4; ++r) {
    const int64_t rows = r < 3 ? 1 : 0;
    std::vector<std::pair<std::string, std::vector<int64_t>>> offsets = {{"w", {r, 0}}};
    std::map<std::string, io::SafetensorsEntry> entries = {{"w", Entry({rows, 6})}};
    if (r == 1) {  // a 0-d step, stored once, in any file
      entries["optim.state.w.step"] = Entry({});
      offsets.push_back({"optim.state.w.step", {}});
    }
    files.push_back(File("f" + std::to_string(r), entries, offsets));
  }
  auto index = BuildDcpIndex(files);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->at("w").shape, (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(index->at("w").chunks.size(), 3u);
  EXPECT_TRUE(index->at("optim.state.w.step").shape.empty());
  EXPECT_EQ(index->at("optim.state.w.step").chunks[0].file, 1u);
}

TEST(DcpLayoutTest, NoShardingInfoIsAWholeTensor) {
  DcpFileView plain{"model.safetensors", {{"w", Entry({2, 3})}}, {{"format", "pt"}}};
  auto index = BuildDcpIndex({plain});
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->at("w").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(index->at("w").chunks[0].block, (Block{{0, 0}, {2, 3}}));
}

TEST(DcpLayoutTest, IdenticalReplicasAreKeptOnce) {
  auto index = BuildDcpIndex({File("a", {{"b", Entry({4})}}, {{"b", {0}}}),
                              File("b", {{"b", Entry({4})}}, {{"b", {0}}})});
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->at("b").chunks.size(), 1u);
}

TEST(DcpLayoutTest, InconsistentCheckpointsAreDataLoss) {
  // Overlap.
  auto overlap = BuildDcpIndex({File("a", {{"w", Entry({3, 2})}}, {{"w", {0, 0}}}),
                                File("b", {{"w", Entry({3, 2})}}, {{"w", {2, 0}}})});
  EXPECT_EQ(overlap.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(overlap.status().message(), HasSubstr("overlap"));
  // A gap: rows 0-1 and 3-4 of 5.
  auto gap = BuildDcpIndex({File("a", {{"w", Entry({2, 2})}}, {{"w", {0, 0}}}),
                            File("b", {{"w", Entry({2, 2})}}, {{"w", {3, 0}}})});
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(gap.status().message(), HasSubstr("cover"));
  // Dtypes that differ between files.
  auto dtype = BuildDcpIndex({File("a", {{"w", Entry({1, 2})}}, {{"w", {0, 0}}}),
                              File("b", {{"w", Entry({1, 2}, "BF16")}}, {{"w", {1, 0}}})});
  EXPECT_EQ(dtype.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dtype.status().message(), HasSubstr("b: w is BF16 but a has it as F32"));
  // Offsets of the wrong rank, and sharding info that is not JSON.
  auto rank = BuildDcpIndex({File("a", {{"w", Entry({1, 2})}}, {{"w", {0}}})});
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(rank.status().message(), HasSubstr("a: w has 2 dims but 1 saved_offsets"));
  DcpFileView garbage{"g", {{"w", Entry({1})}}, {{kDcpShardingInfoKey, "{not json"}}};
  auto bad = BuildDcpIndex({garbage});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), HasSubstr("g: DCP_SHARDING_INFO is not a JSON object"));
}

}  // namespace
}  // namespace tpudist::fsdp
