#include "fsdp/device_mesh.h"

#include <atomic>

#include <ATen/ATen.h>

#include "fsdp/mesh_math.h"
#include "testing/device_mesh_ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::fsdp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using test_support::RankContext;
using test_support::RunMeshRanks;

// Sum of global ranks over the group along `dim`: checks the group is real
// and has the members the mesh claims.
int64_t GroupRankSum(const DeviceMesh& mesh, int dim) {
  std::vector<at::Tensor> t = {at::full({1}, mesh.global_rank(), at::kLong)};
  mesh.Group(dim)->allreduce(t)->wait(mesh.collective_timeout_ms());
  return t[0].item<int64_t>();
}

TEST(DeviceMeshTest, OneDimMeshOfAllRanks) {
  RunMeshRanks(4, [](const RankContext& ctx) {
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("tpu", {4}, {"tp"}, ctx.env);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    EXPECT_EQ(mesh->size(), 4);
    EXPECT_THAT(mesh->coordinate(), ElementsAre(ctx.rank));
    EXPECT_EQ(mesh->Group(0)->getSize(), 4);
    EXPECT_EQ(mesh->Group(0)->getRank(), ctx.rank);
    EXPECT_EQ(GroupRankSum(*mesh, 0), 0 + 1 + 2 + 3);
  });
}

TEST(DeviceMeshTest, TwoByTwoGroupsSlicesAndCaching) {
  RunMeshRanks(4, [](const RankContext& ctx) {
    DeviceMeshEnv env = ctx.env;
    std::atomic<int> created{0};
    GroupFactory inner = env.group_factory;
    env.group_factory = [&](const c10::intrusive_ptr<c10d::Store>& s, int r,
                            const std::vector<int>& ranks) {
      ++created;
      return inner(s, r, ranks);
    };
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("tpu", {2, 2}, {"dp", "tp"}, env);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    EXPECT_EQ(created.load(), 2);  // one group per mesh dim, for this rank
    const int dp = ctx.rank / 2, tp = ctx.rank % 2;
    EXPECT_THAT(mesh->coordinate(), ElementsAre(dp, tp));
    // tp groups {0,1},{2,3}; dp groups {0,2},{1,3}.
    EXPECT_EQ(GroupRankSum(*mesh, 1), dp == 0 ? 1 : 5);
    EXPECT_EQ(GroupRankSum(*mesh, 0), tp == 0 ? 2 : 4);

    absl::StatusOr<DeviceMesh> tp_mesh = mesh->Slice("tp");
    ASSERT_TRUE(tp_mesh.ok());
    EXPECT_EQ(tp_mesh->ndim(), 1);
    EXPECT_THAT(tp_mesh->ranks(), ElementsAre(2 * dp, 2 * dp + 1));
    EXPECT_EQ(tp_mesh->Group(0).get(), mesh->Group(1).get());  // cached, shared
    const std::vector<std::string> swapped = {"tp", "dp"};
    absl::StatusOr<DeviceMesh> t = mesh->Slice(swapped);
    ASSERT_TRUE(t.ok());
    EXPECT_THAT(t->ranks(), ElementsAre(0, 2, 1, 3));
    EXPECT_THAT(t->coordinate(), ElementsAre(tp, dp));
    EXPECT_EQ(created.load(), 2);  // slicing created nothing

    EXPECT_EQ(mesh->Slice("pp").status().code(), absl::StatusCode::kNotFound);
    const std::vector<std::string> twice = {"tp", "tp"};
    EXPECT_FALSE(mesh->Slice(twice).ok());
    EXPECT_EQ((*mesh->Group("dp")).get(), mesh->Group(0).get());
  });
}

TEST(DeviceMeshTest, BadMeshesError) {
  RunMeshRanks(1, [](const RankContext& ctx) {
    DeviceMeshEnv env = ctx.env;
    env.world_size = 4;
    absl::Status s = InitDeviceMesh("tpu", {3, 2}, {"dp", "tp"}, env).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("holds 6 devices but the world has 4"));
    EXPECT_THAT(std::string(InitDeviceMesh("tpu", {2, 2}, {"tp", "tp"}, env).status().message()),
                HasSubstr("appears twice"));
    EXPECT_FALSE(InitDeviceMesh("tpu", {4}, {"dp", "tp"}, env).ok());
    env.group_factory = nullptr;
    EXPECT_FALSE(InitDeviceMesh("tpu", {4}, {}, env).ok());
  });
}

TEST(DeviceMeshTest, FactoryErrorNamesDimAndRanks) {
  RunMeshRanks(2, [](const RankContext& ctx) {
    DeviceMeshEnv env = ctx.env;
    env.group_factory = [](const c10::intrusive_ptr<c10d::Store>&, int, const std::vector<int>&)
        -> absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> {
      return absl::UnavailableError("no transport");
    };
    absl::Status s = InitDeviceMesh("tpu", {2}, {"tp"}, env).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(std::string(s.message()), HasSubstr("mesh dim 0 (ranks 0, 1)"));
  });
}

TEST(DeviceMeshTest, SliceTopologyKeepsTpInsideHosts) {
  tpu_runtime::SliceSpec v6e;
  v6e.accelerator_type = "v6e";
  v6e.num_hosts = 4;
  v6e.devices_per_host = 4;
  tpu_runtime::SliceSpec tpu7x;
  tpu7x.accelerator_type = "tpu7x";
  tpu7x.num_hosts = 2;
  tpu7x.devices_per_host = 8;
  for (const auto& [slice, tp] : std::vector<std::pair<tpu_runtime::SliceSpec, int64_t>>{
           {v6e, 4}, {v6e, 2}, {v6e, 1}, {tpu7x, 8}, {tpu7x, 4}}) {
    absl::StatusOr<std::vector<int64_t>> shape = DpTpShapeForSlice(slice, tp);
    ASSERT_TRUE(shape.ok()) << shape.status();
    EXPECT_THAT(*shape, ElementsAre(16 / tp, tp));
    std::vector<int> ranks(16);
    for (int i = 0; i < 16; ++i) ranks[i] = i;
    for (const std::vector<int>& group : GroupsAlongDim(*shape, ranks, 1)) {
      for (int r : group) EXPECT_EQ(r / slice.devices_per_host, group[0] / slice.devices_per_host);
    }
  }
  EXPECT_THAT(std::string(DpTpShapeForSlice(v6e, 8).status().message()),
              HasSubstr("tp=8 must divide the 4 devices per host"));
  EXPECT_FALSE(DpTpShapeForSlice(v6e, 3).ok());
  EXPECT_FALSE(DpTpShapeForSlice(v6e, 0).ok());
}

}  // namespace
}  // namespace tpudist::fsdp
