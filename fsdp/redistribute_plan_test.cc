#include "fsdp/redistribute_plan.h"

#include "gtest/gtest.h"

namespace tpudist::fsdp {
namespace {

const Placement R = Placement::Replicate();
const Placement P = Placement::Partial();
Placement S(int64_t d) { return Placement::Shard(d); }

std::string Plan(std::vector<Placement> src, std::vector<Placement> dst) {
  return PlanToString(PlanRedistribute(src, dst));
}

TEST(RedistributePlanTest, OneDimTransitions) {
  EXPECT_EQ(Plan({S(0)}, {R}), "gather@0 S(0)->R");
  EXPECT_EQ(Plan({P}, {R}), "allreduce@0 P(sum)->R");
  EXPECT_EQ(Plan({P}, {S(1)}), "reduce_scatter@0 P(sum)->S(1)");
  EXPECT_EQ(Plan({R}, {S(0)}), "chunk@0 R->S(0)");
  EXPECT_EQ(Plan({S(0)}, {S(1)}), "alltoall@0 S(0)->S(1)");
  EXPECT_EQ(Plan({R}, {P}), "partition@0 R->P(sum)");
  EXPECT_EQ(Plan({S(0)}, {P}), "embed@0 S(0)->P(sum)");
  EXPECT_EQ(Plan({S(0)}, {Placement::Partial(ReduceOp::kMax)}),
            "gather@0 S(0)->R; partition@0 R->P(max)");
  EXPECT_EQ(Plan({P}, {Placement::Partial(ReduceOp::kMax)}),
            "allreduce@0 P(sum)->R; partition@0 R->P(max)");
  EXPECT_EQ(Plan({S(1)}, {S(1)}), "");
}

TEST(RedistributePlanTest, InnerShardIsGatheredBeforeOuterChanges) {
  // [S(0), S(0)] -> [R, S(0)]: mesh dim 1 is inside dim 0's chunk, so it must
  // be gathered first and re-chunked after.
  EXPECT_EQ(Plan({S(0), S(0)}, {R, S(0)}),
            "gather@1 S(0)->R; gather@0 S(0)->R; chunk@1 R->S(0)");
  // An outer change on another tensor dim does not disturb it.
  EXPECT_EQ(Plan({S(1), S(0)}, {R, S(0)}), "gather@0 S(1)->R");
  // [R, S(0)] -> [S(0), S(0)]: dim 0 now chunks outside dim 1.
  EXPECT_EQ(Plan({R, S(0)}, {S(0), S(0)}),
            "gather@1 S(0)->R; chunk@0 R->S(0); chunk@1 R->S(0)");
}

// S(d) -> P(sum) embeds right to left, as torch 2.15 does (checked against
// it in dtensor_oracle_test.cc): an inner shard embeds inside its outer
// chunk, which may then embed or gather in turn.
TEST(RedistributePlanTest, ShardToPartialEmbedsInnerFirst) {
  EXPECT_EQ(Plan({S(0), S(0)}, {P, P}), "embed@1 S(0)->P(sum); embed@0 S(0)->P(sum)");
  EXPECT_EQ(Plan({S(0), S(0)}, {R, P}), "embed@1 S(0)->P(sum); gather@0 S(0)->R");
  EXPECT_EQ(Plan({S(0), S(0)}, {P, R}), "gather@1 S(0)->R; embed@0 S(0)->P(sum)");
  EXPECT_EQ(Plan({S(0), S(0)}, {P, S(0)}),
            "gather@1 S(0)->R; embed@0 S(0)->P(sum); chunk@1 R->S(0)");
}

TEST(RedistributePlanTest, AllToAllOnlyWhenNoOtherDimTouches) {
  EXPECT_EQ(Plan({R, S(0)}, {R, S(1)}), "alltoall@1 S(0)->S(1)");
  EXPECT_EQ(Plan({S(0), S(1)}, {S(1), S(0)}),
            "gather@1 S(1)->R; gather@0 S(0)->R; chunk@0 R->S(1); chunk@1 R->S(0)");
  EXPECT_EQ(Plan({P, S(0)}, {S(1), R}), "gather@1 S(0)->R; reduce_scatter@0 P(sum)->S(1)");
}

}  // namespace
}  // namespace tpudist::fsdp
