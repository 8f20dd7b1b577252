#include "tpu_runtime/rank_info.h"

#include "gtest/gtest.h"

namespace tpudist::tpu_runtime {
namespace {

TEST(RankInfoTest, ToStringNamesRankHostAndSource) {
  RankInfo info;
  info.rank = 3;
  info.world_size = 16;
  info.local_rank = 3;
  info.local_world_size = 4;
  info.num_hosts = 4;
  info.slice.accelerator_type = "v6e";
  info.slice.chip_topology = {4, 4};
  info.source = DiscoverySource::kKubeRayTpu;
  EXPECT_EQ(ToString(info), "rank 3/16 local 3/4 host 0/4 (v6e 4x4, kuberay-tpu)");
}

TEST(RankInfoTest, SlicebuilderAddressOutOfRangeIsEmpty) {
  RankInfo info;
  info.rank = 1;
  info.slicebuilder_addresses = {"h0:8471"};
  EXPECT_EQ(info.slicebuilder_address(), "");
  info.rank = 0;
  EXPECT_EQ(info.slicebuilder_address(), "h0:8471");
}

TEST(RankInfoTest, EqualityCoversSlice) {
  RankInfo a, b;
  EXPECT_EQ(a, b);
  b.slice.chiplets_per_chip = 2;
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace tpudist::tpu_runtime
