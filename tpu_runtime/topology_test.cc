#include "tpu_runtime/topology.h"

#include <tuple>

#include "absl/strings/str_cat.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::tpu_runtime {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class AcceleratorNameTest
    : public ::testing::TestWithParam<std::tuple<const char*, const char*, int>> {};

TEST_P(AcceleratorNameTest, Normalizes) {
  const auto& [input, generation, suffix] = GetParam();
  absl::StatusOr<AcceleratorType> a = ParseAcceleratorType("TPU_ACCELERATOR_TYPE", input);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->generation, generation) << input;
  EXPECT_EQ(a->suffix_count, suffix) << input;
}

INSTANTIATE_TEST_SUITE_P(
    Spellings, AcceleratorNameTest,
    ::testing::Values(std::make_tuple("TPU-V6E", "v6e", 0), std::make_tuple("v6e", "v6e", 0),
                      std::make_tuple("v6e-16", "v6e", 16),
                      std::make_tuple("tpu-v6e-slice", "v6e", 0),
                      std::make_tuple("v5litepod-16", "v5e", 16),
                      std::make_tuple("tpu-v5-lite-podslice", "v5e", 0),
                      std::make_tuple("tpu-v5-lite-device", "v5e", 0),
                      std::make_tuple("v5e", "v5e", 0), std::make_tuple("v5p-8", "v5p", 8),
                      std::make_tuple("tpu-v5p-slice", "v5p", 0),
                      std::make_tuple("TPU7X", "tpu7x", 0), std::make_tuple("tpu7x", "tpu7x", 0),
                      std::make_tuple("tpu7x-16", "tpu7x", 16),
                      std::make_tuple("v7x", "tpu7x", 0), std::make_tuple("v4-8", "v4", 8),
                      std::make_tuple("tpu-v4-podslice", "v4", 0),
                      std::make_tuple(" v6e-4 ", "v6e", 4)));

TEST(AcceleratorTypeTest, RejectsUnknownNamingVariableAndValue) {
  for (const char* bad : {"", "v3-8", "gpu", "v6", "tpu-", "v6e-", "v6e-0", "v6e--4", "v6e-16x"}) {
    absl::StatusOr<AcceleratorType> a = ParseAcceleratorType("TPU_ACCELERATOR_TYPE", bad);
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(a.status().message(),
                HasSubstr(absl::StrCat("TPU_ACCELERATOR_TYPE=\"", bad, "\"")));
    EXPECT_THAT(a.status().message(), HasSubstr("expected"));
  }
}

TEST(ChipTopologyTest, ParsesTwoAndThreeDims) {
  EXPECT_THAT(*ParseChipTopology("TPU_TOPOLOGY", "4x4"), ElementsAre(4, 4));
  EXPECT_THAT(*ParseChipTopology("TPU_TOPOLOGY", "2x2x2"), ElementsAre(2, 2, 2));
  EXPECT_THAT(*ParseChipTopology("TPU_TOPOLOGY", "16x16"), ElementsAre(16, 16));
}

TEST(ChipTopologyTest, MalformedGivesTheDocumentedMessage) {
  absl::StatusOr<std::vector<int>> t = ParseChipTopology("TPU_TOPOLOGY", "4x");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(),
            "TPU_TOPOLOGY=\"4x\": expected positive integers separated by 'x', like \"4x4\" or "
            "\"2x2x2\"");
  for (const char* bad : {"x4", "0x4", "-1x4", "4xa", "", "4,4", "4", "2x2x2x2", "4x 4", "+4x4",
                          "4xx4"}) {
    t = ParseChipTopology("TPU_TOPOLOGY", bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_THAT(t.status().message(), HasSubstr(absl::StrCat("TPU_TOPOLOGY=\"", bad, "\"")));
  }
}

TEST(ChipTopologyTest, OverflowIsAnError) {
  for (const char* big : {"99999999999x4", "65536x65536", "1024x1024x2", "2147483647x2"}) {
    absl::StatusOr<std::vector<int>> t = ParseChipTopology("TPU_TOPOLOGY", big);
    ASSERT_FALSE(t.ok()) << big;
    EXPECT_THAT(t.status().message(), HasSubstr("overflows")) << big;
  }
  EXPECT_TRUE(ParseChipTopology("TPU_TOPOLOGY", "1024x1024").ok());
}

TEST(ProcessTopologyTest, ParsesThreeAndFourDims) {
  EXPECT_THAT(*ParseProcessTopology("TORCH_TPU_TOPOLOGY", "4,4,1"), ElementsAre(4, 4, 1));
  EXPECT_THAT(*ParseProcessTopology("TORCH_TPU_TOPOLOGY", "2,2,2,2"), ElementsAre(2, 2, 2, 2));
  for (const char* bad : {"4,4", "4x4", "4,4,", ",4,4", "4,0,1", "4,-1,1", "1,1,1,1,1", ""}) {
    absl::StatusOr<std::vector<int>> t = ParseProcessTopology("TORCH_TPU_TOPOLOGY", bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_THAT(t.status().message(),
                HasSubstr(absl::StrCat("TORCH_TPU_TOPOLOGY=\"", bad, "\": expected 3 or 4")));
  }
}

TEST(ConversionTest, RayNormalizeRule) {
  EXPECT_THAT(ProcessTopologyFromChips({4, 4}, 1), ElementsAre(4, 4, 1));
  EXPECT_THAT(ProcessTopologyFromChips({2, 2, 2}, 2), ElementsAre(2, 2, 2, 2));
  EXPECT_THAT(ProcessTopologyFromChips({2, 2, 1}, 1), ElementsAre(2, 2, 1));
  EXPECT_EQ(FormatProcessTopology(ProcessTopologyFromChips({4, 4}, 1)), "4,4,1");
  EXPECT_EQ(FormatChipTopology({2, 2, 2}), "2x2x2");
}

TEST(ConversionTest, InverseRoundTrips) {
  for (const auto& [gen, chips, chiplets] :
       {std::make_tuple("v6e", std::vector<int>{4, 4}, 1),
        std::make_tuple("v5e", std::vector<int>{2, 4}, 1),
        std::make_tuple("tpu7x", std::vector<int>{2, 2, 2}, 2),
        std::make_tuple("tpu7x", std::vector<int>{2, 2, 1}, 2),
        std::make_tuple("v5p", std::vector<int>{2, 2, 4}, 1),
        std::make_tuple("v4", std::vector<int>{2, 2, 1}, 1)}) {
    absl::StatusOr<ChipLayout> l =
        ChipLayoutFromProcessTopology("T", ProcessTopologyFromChips(chips, chiplets), gen);
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_EQ(l->chip_dims, chips) << gen;
    EXPECT_EQ(l->chiplets_per_chip, chiplets) << gen;
  }
  absl::StatusOr<ChipLayout> bad = ChipLayoutFromProcessTopology("TORCH_TPU_TOPOLOGY",
                                                                 {4, 4, 2}, "v6e");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("TORCH_TPU_TOPOLOGY=\"4,4,2\""));
  EXPECT_THAT(bad.status().message(), HasSubstr("3rd dimension must be 1"));
}

TEST(ChipletsTest, DefaultsAndRayResourcePerChip) {
  EXPECT_EQ(*ChipletsPerChip("tpu7x", ""), 2);
  EXPECT_EQ(*ChipletsPerChip("v6e", ""), 1);
  EXPECT_EQ(*ChipletsPerChip("tpu7x", "2"), 2);
  EXPECT_EQ(*ChipletsPerChip("tpu7x", "1"), 1);
  EXPECT_EQ(*ChipletsPerChip("v6e", "1"), 1);
  absl::StatusOr<int> c = ChipletsPerChip("v6e", "2");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("RAY_TPU_RESOURCE_PER_CHIP=\"2\""));
  EXPECT_THAT(c.status().message(), HasSubstr("only tpu7x"));
  for (const char* bad : {"0", "3", "-1", "two", "1.5"}) {
    c = ChipletsPerChip("tpu7x", bad);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_THAT(c.status().message(), HasSubstr("expected 1 or 2"));
  }
}

TEST(ChipsPerHostTest, SingleHostSmallSlicesElseFour) {
  EXPECT_EQ(ChipsPerHost("v6e", {1, 1}), 1);
  EXPECT_EQ(ChipsPerHost("v6e", {2, 2}), 4);
  EXPECT_EQ(ChipsPerHost("v6e", {2, 4}), 8);
  EXPECT_EQ(ChipsPerHost("v5e", {2, 4}), 8);
  EXPECT_EQ(ChipsPerHost("v6e", {4, 4}), 4);
  EXPECT_EQ(ChipsPerHost("v5e", {4, 8}), 4);
  EXPECT_EQ(ChipsPerHost("v5p", {2, 2, 2}), 4);
  EXPECT_EQ(ChipsPerHost("v4", {2, 2, 4}), 4);
  EXPECT_EQ(ChipsPerHost("tpu7x", {2, 2, 2}), 4);
  EXPECT_EQ(ChipsPerHost("tpu7x", {1, 1, 1}), 1);
}

TEST(MakeSliceSpecTest, SeedSlices) {
  absl::StatusOr<SliceSpec> v6e = MakeSliceSpec("TPU_TOPOLOGY", "v6e", {4, 4}, 1, "s");
  ASSERT_TRUE(v6e.ok()) << v6e.status();
  EXPECT_EQ(v6e->num_hosts, 4);
  EXPECT_EQ(v6e->devices_per_host, 4);
  EXPECT_EQ(v6e->num_devices(), 16);
  EXPECT_THAT(v6e->process_topology, ElementsAre(4, 4, 1));
  EXPECT_EQ(v6e->slice_name, "s");

  absl::StatusOr<SliceSpec> x = MakeSliceSpec("TPU_TOPOLOGY", "tpu7x", {2, 2, 2}, 2, "");
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->num_hosts, 2);
  EXPECT_EQ(x->devices_per_host, 8);
  EXPECT_EQ(x->num_devices(), 16);
  EXPECT_THAT(x->process_topology, ElementsAre(2, 2, 2, 2));
}

TEST(MakeSliceSpecTest, RejectsPartialHostsAndWrongRank) {
  absl::StatusOr<SliceSpec> s = MakeSliceSpec("TPU_TOPOLOGY", "v6e", {2, 3}, 1, "");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("TPU_TOPOLOGY=\"2x3\""));
  EXPECT_THAT(s.status().message(), HasSubstr("multiple of 4"));
  s = MakeSliceSpec("TPU_TOPOLOGY", "tpu7x", {4, 4}, 2, "");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("expected a 3-D topology for tpu7x"));
  s = MakeSliceSpec("TPU_TOPOLOGY", "v6e", {2, 2, 2}, 1, "");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("expected a 2-D topology for v6e"));
}

}  // namespace
}  // namespace tpudist::tpu_runtime
