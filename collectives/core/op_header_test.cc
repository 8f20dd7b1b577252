#include "collectives/core/op_header.h"

#include <string>

#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

OpSpec Spec(DataType dtype, std::vector<int64_t> shape, int64_t count, uint32_t seq = 3) {
  OpSpec spec;
  spec.ctx.name = "allreduce";
  spec.seq = seq;
  spec.dtype = dtype;
  spec.shape.assign(shape.begin(), shape.end());
  spec.count = count;
  return spec;
}

TEST(OpHeaderTest, DescribeHeaderNamesTheCall) {
  const OpHeader h = MakeHeader(Spec(DataType::kFloat32, {2, 5}, 10), OpKind::kAllreduce,
                                ReduceKind::kSum, -1, true);
  EXPECT_EQ(DescribeHeader(h), "allreduce #3 dtype=float32 shape=[2,5] count=10 op=SUM");
  const OpHeader b = MakeHeader(Spec(DataType::kBFloat16, {4}, 4), OpKind::kBroadcast,
                                ReduceKind{}, 1, true);
  EXPECT_EQ(DescribeHeader(b), "broadcast #3 dtype=bfloat16 shape=[4] count=4 root=1");
}

TEST(OpHeaderTest, HeadersAgreeComparesEveryField) {
  const OpSpec spec = Spec(DataType::kFloat32, {10}, 10);
  const OpHeader a = MakeHeader(spec, OpKind::kAllreduce, ReduceKind::kSum, -1, true);
  EXPECT_TRUE(HeadersAgree(a, a));
  EXPECT_FALSE(HeadersAgree(a, MakeHeader(spec, OpKind::kAllreduce, ReduceKind::kMax, -1, true)));
  EXPECT_FALSE(HeadersAgree(a, MakeHeader(spec, OpKind::kReduce, ReduceKind::kSum, -1, true)));
  EXPECT_FALSE(HeadersAgree(a, MakeHeader(spec, OpKind::kAllreduce, ReduceKind::kSum, 0, true)));
  EXPECT_FALSE(HeadersAgree(a, MakeHeader(Spec(DataType::kFloat32, {10}, 10, 4),
                                          OpKind::kAllreduce, ReduceKind::kSum, -1, true)));
  EXPECT_FALSE(HeadersAgree(a, MakeHeader(Spec(DataType::kFloat64, {10}, 10),
                                          OpKind::kAllreduce, ReduceKind::kSum, -1, true)));
  EXPECT_FALSE(HeadersAgree(a, MakeHeader(Spec(DataType::kFloat32, {2, 5}, 10),
                                          OpKind::kAllreduce, ReduceKind::kSum, -1, true)));
  EXPECT_FALSE(HeadersAgree(a, MakeHeader(Spec(DataType::kFloat32, {11}, 11),
                                          OpKind::kAllreduce, ReduceKind::kSum, -1, true)));
}

TEST(OpHeaderTest, CountsIgnoredUnlessBothCheckThem) {
  const OpHeader a = MakeHeader(Spec(DataType::kUInt8, {6}, 6), OpKind::kAlltoall,
                                ReduceKind{}, -1, false);
  const OpHeader b = MakeHeader(Spec(DataType::kUInt8, {9}, 9), OpKind::kAlltoall,
                                ReduceKind{}, -1, false);
  EXPECT_TRUE(HeadersAgree(a, b));
}

// Every header HeadersAgree tells apart from `a` has another digest, equal
// headers one digest, and the hint field and unchecked counts none.
TEST(OpHeaderTest, HeaderDigestSeparatesWhatHeadersAgreeSeparates) {
  const OpSpec spec = Spec(DataType::kFloat32, {10}, 10);
  const OpHeader a = MakeHeader(spec, OpKind::kAllreduce, ReduceKind::kSum, -1, true);
  const std::vector<OpHeader> others = {
      MakeHeader(spec, OpKind::kAllreduce, ReduceKind::kMax, -1, true),
      MakeHeader(spec, OpKind::kReduce, ReduceKind::kSum, -1, true),
      MakeHeader(spec, OpKind::kAllreduce, ReduceKind::kSum, 0, true),
      MakeHeader(Spec(DataType::kFloat32, {10}, 10, 4), OpKind::kAllreduce, ReduceKind::kSum,
                 -1, true),
      MakeHeader(Spec(DataType::kFloat64, {10}, 10), OpKind::kAllreduce, ReduceKind::kSum, -1,
                 true),
      MakeHeader(Spec(DataType::kFloat32, {2, 5}, 10), OpKind::kAllreduce, ReduceKind::kSum, -1,
                 true),
      MakeHeader(Spec(DataType::kFloat32, {11}, 11), OpKind::kAllreduce, ReduceKind::kSum, -1,
                 true),
  };
  for (const OpHeader& b : others) {
    ASSERT_FALSE(HeadersAgree(a, b)) << DescribeHeader(b);
    EXPECT_NE(HeaderDigest(a), HeaderDigest(b)) << DescribeHeader(b);
  }
  OpHeader hinted = a;
  hinted.saw_foreign_load = 1;
  EXPECT_EQ(HeaderDigest(a), HeaderDigest(hinted));
  EXPECT_EQ(HeaderDigest(a), HeaderDigest(MakeHeader(spec, OpKind::kAllreduce,
                                                     ReduceKind::kSum, -1, true)));
  const OpHeader x = MakeHeader(Spec(DataType::kUInt8, {6}, 6), OpKind::kAlltoall,
                                ReduceKind{}, -1, false);
  const OpHeader y = MakeHeader(Spec(DataType::kUInt8, {9}, 9), OpKind::kAlltoall,
                                ReduceKind{}, -1, false);
  EXPECT_EQ(HeaderDigest(x), HeaderDigest(y));
  EXPECT_NE(HeaderDigest(OpHeader{}), 0u);
}

TEST(OpHeaderTest, MakeHeaderKeepsAtMostMaxDims) {
  std::vector<int64_t> shape(OpHeader::kMaxDims + 2, 1);
  const OpHeader h = MakeHeader(Spec(DataType::kInt32, shape, 1), OpKind::kAllgather,
                                ReduceKind{}, -1, true);
  EXPECT_EQ(h.ndim, OpHeader::kMaxDims);
  EXPECT_EQ(h.count, 1);
  EXPECT_EQ(h.reduce, 0);
}

}  // namespace
}  // namespace tpudist::collectives
