#include "fsdp/mesh_math.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::fsdp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<int> Iota(int n) {
  std::vector<int> r(n);
  for (int i = 0; i < n; ++i) r[i] = i;
  return r;
}

TEST(MeshMathTest, ValidShapes) {
  EXPECT_TRUE(ValidateMeshShape({16}, {}, 16).ok());
  EXPECT_TRUE(ValidateMeshShape({4, 4}, {"dp", "tp"}, 16).ok());
  EXPECT_TRUE(ValidateMeshShape({1}, {"tp"}, 1).ok());
}

TEST(MeshMathTest, ProductMustEqualWorld) {
  absl::Status s = ValidateMeshShape({3, 4}, {"dp", "tp"}, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("holds 12 devices but the world has 16"));
}

TEST(MeshMathTest, BadNamesAndSizes) {
  EXPECT_THAT(std::string(ValidateMeshShape({2, 2}, {"tp", "tp"}, 4).message()),
              HasSubstr("'tp' appears twice"));
  EXPECT_THAT(std::string(ValidateMeshShape({4}, {"dp", "tp"}, 4).message()),
              HasSubstr("2 names"));
  EXPECT_FALSE(ValidateMeshShape({0, 4}, {}, 0).ok());
  EXPECT_FALSE(ValidateMeshShape({}, {}, 1).ok());
  EXPECT_FALSE(ValidateMeshShape({2}, {""}, 2).ok());
}

TEST(MeshMathTest, RowMajorCoordinates) {
  EXPECT_THAT(UnravelIndex({2, 4}, 6), ElementsAre(1, 2));
  EXPECT_THAT(UnravelIndex({2, 3, 2}, 11), ElementsAre(1, 2, 1));
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(RavelIndex({2, 3, 2}, UnravelIndex({2, 3, 2}, i)), i);
  const std::vector<int> ranks = {10, 11, 12, 13};
  EXPECT_THAT(*CoordinateOfRank({2, 2}, ranks, 12), ElementsAre(1, 0));
  EXPECT_EQ(CoordinateOfRank({2, 2}, ranks, 3).status().code(), absl::StatusCode::kNotFound);
}

TEST(MeshMathTest, GroupsOfTwoByFour) {
  const std::vector<int> ranks = Iota(8);
  // mesh["tp"] on ranks 0-3 is [0,1,2,3]; mesh["dp"] on 0 and 4 is [0,4].
  EXPECT_THAT(GroupsAlongDim({2, 4}, ranks, 1),
              ElementsAre(ElementsAre(0, 1, 2, 3), ElementsAre(4, 5, 6, 7)));
  EXPECT_THAT(GroupsAlongDim({2, 4}, ranks, 0),
              ElementsAre(ElementsAre(0, 4), ElementsAre(1, 5), ElementsAre(2, 6),
                          ElementsAre(3, 7)));
  const int tp[] = {1};
  EXPECT_THAT(SubMeshRanks({2, 4}, ranks, {1, 2}, tp), ElementsAre(4, 5, 6, 7));
}

TEST(MeshMathTest, SubMeshKeepsRequestedOrder) {
  const std::vector<int> ranks = Iota(12);
  const int swapped[] = {1, 0};
  // shape (2, 3, 2) through (1, 0, 1): keep dims 1 then 0 -> ranks at (i, j, 1)
  // ordered by (j, i).
  EXPECT_THAT(SubMeshRanks({2, 3, 2}, ranks, {1, 0, 1}, swapped),
              ElementsAre(1, 7, 3, 9, 5, 11));
  // Every rank lies in exactly one group along each dim.
  for (int dim = 0; dim < 3; ++dim) {
    std::vector<int> count(12, 0);
    for (const auto& g : GroupsAlongDim({2, 3, 2}, ranks, dim)) {
      for (int r : g) ++count[r];
    }
    EXPECT_THAT(count, ::testing::Each(1));
  }
}

}  // namespace
}  // namespace tpudist::fsdp
