// AllGatherJson / AgreeOnStatus / MeshFlatRank over a 2 x 3 mesh: every
// rank sees every value in row-major order, and one failing rank fails all.
#include "fsdp/fully_shard/mesh_agreement.h"

#include <string>

#include "testing/fsdp_util.h"
#include "gtest/gtest.h"

namespace tpudist::fsdp {
namespace {

using test_support::Rank;
using test_support::RunMeshRanks;

TEST(MeshAgreementTest, GatherAndAgreeOverTwoDims) {
  RunMeshRanks(6, [&](const Rank& r) {
    absl::StatusOr<DeviceMesh> mesh = InitDeviceMesh("cpu", {2, 3}, {"dp", "tp"}, r.env);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    const int64_t me = MeshFlatRank(*mesh);
    EXPECT_EQ(me, mesh->LocalRank(0) * 3 + mesh->LocalRank(1));
    // Variable lengths: rank i sends i + 1 copies of its index.
    const nlohmann::json mine = {{"rank", me}, {"pad", std::string(me + 1, 'x')}};
    absl::StatusOr<std::vector<nlohmann::json>> all = AllGatherJson(*mesh, mine, "test gather");
    ASSERT_TRUE(all.ok()) << all.status();
    ASSERT_EQ(all->size(), 6u);
    for (int64_t i = 0; i < 6; ++i) {
      EXPECT_EQ((*all)[i]["rank"], i);
      EXPECT_EQ((*all)[i]["pad"].get<std::string>().size(), static_cast<size_t>(i + 1));
    }
    EXPECT_TRUE(AgreeOnStatus(*mesh, absl::OkStatus(), "ok").ok());
    const absl::Status mine_status = me == 4 ? absl::InternalError("rank 4 broke") : absl::OkStatus();
    const absl::Status s = AgreeOnStatus(*mesh, mine_status, "agree");
    EXPECT_EQ(s.code(), me == 4 ? absl::StatusCode::kInternal : absl::StatusCode::kAborted) << s;
  });
}

}  // namespace
}  // namespace tpudist::fsdp
