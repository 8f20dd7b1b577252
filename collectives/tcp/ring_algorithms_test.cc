// Every ring algorithm against a directly computed expectation, over both
// transports (in-memory and TcpMesh on 127.0.0.1 with a c10d::HashStore),
// W in {1, 2, 3, 4, 8} ranks as threads, and element counts {0, 1, a prime,
// a few MiB}.

#include "collectives/tcp/ring_algorithms.h"

#include <memory>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <tuple>
#include <vector>

#include "absl/time/clock.h"
#include "collectives/tcp/in_memory_transport.h"
#include "collectives/tcp/tcp_mesh.h"
#include "testing/tcp_util.h"
#include "gtest/gtest.h"

namespace tpudist::collectives::tcp {
namespace {

using test_support::AsBytes;
using test_support::ByteInput;
using test_support::FloatInput;
using test_support::IntInput;
using test_support::RunRankThreads;
using test_support::SumReducer;

enum class Kind { kInMemory, kTcp };

constexpr size_t kPrime = 1009;
constexpr size_t kLarge = (3u << 20) / 4 + 3;  // ~3 MiB of fp32, not a multiple of W.

class RingAlgorithmsTest : public ::testing::TestWithParam<std::tuple<Kind, int, size_t>> {
 protected:
  void SetUp() override {
    world_ = std::get<1>(GetParam());
    count_ = std::get<2>(GetParam());
    if (std::get<0>(GetParam()) == Kind::kTcp) {
      store_ = c10::make_intrusive<c10d::HashStore>();
      TcpMeshOptions options;
      options.group_key = test_support::UniqueKey("ring");
      options.connect_timeout = absl::Seconds(20);
      auto meshes = test_support::ConnectAll(*store_, world_, options);
      ASSERT_TRUE(meshes.ok()) << meshes.status();
      meshes_ = std::move(*meshes);
      for (auto& m : meshes_) transports_.push_back(m.get());
    } else {
      hub_ = std::make_unique<InMemoryHub>(world_);
      for (int r = 0; r < world_; ++r) transports_.push_back(&hub_->transport(r));
    }
  }

  absl::Time Deadline() const { return absl::Now() + absl::Seconds(60); }

  int world_ = 0;
  size_t count_ = 0;
  c10::intrusive_ptr<c10d::HashStore> store_;
  std::vector<std::unique_ptr<TcpMesh>> meshes_;
  std::unique_ptr<InMemoryHub> hub_;
  std::vector<Transport*> transports_;  // [world]
};

TEST_P(RingAlgorithmsTest, AllReduceFloatSum) {
  std::vector<float> expected(count_, 0.f);  // [count]
  for (int r = 0; r < world_; ++r)
    for (size_t i = 0; i < count_; ++i) expected[i] += FloatInput(r, i);
  RunRankThreads(world_, [&](int r) {
    std::vector<float> data(count_);  // [count]
    for (size_t i = 0; i < count_; ++i) data[i] = FloatInput(r, i);
    absl::Status s = RingAllReduce(*transports_[r], AsBytes(data), sizeof(float),
                                   SumReducer<float>(), Deadline());
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(data, expected) << "rank " << r;
  });
}

TEST_P(RingAlgorithmsTest, AllReduceIntSumExact) {
  std::vector<int64_t> expected(count_, 0);  // [count]
  for (int r = 0; r < world_; ++r)
    for (size_t i = 0; i < count_; ++i) expected[i] += IntInput(r, i);
  RunRankThreads(world_, [&](int r) {
    std::vector<int64_t> data(count_);  // [count]
    for (size_t i = 0; i < count_; ++i) data[i] = IntInput(r, i);
    absl::Status s = RingAllReduce(*transports_[r], AsBytes(data), sizeof(int64_t),
                                   SumReducer<int64_t>(), Deadline());
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(data, expected) << "rank " << r;
  });
}

TEST_P(RingAlgorithmsTest, ReduceScatterEqualBlocks) {
  const size_t block = count_;                       // elements per rank
  std::vector<int32_t> expected(world_ * block, 0);  // [world, block]
  for (int r = 0; r < world_; ++r)
    for (size_t i = 0; i < expected.size(); ++i) expected[i] += IntInput(r, i) % 100000;
  RunRankThreads(world_, [&](int r) {
    std::vector<int32_t> data(world_ * block);  // [world, block]
    for (size_t i = 0; i < data.size(); ++i) data[i] = IntInput(r, i) % 100000;
    absl::Status s = RingReduceScatter(*transports_[r], AsBytes(data), sizeof(int32_t),
                                       SumReducer<int32_t>(), Deadline());
    ASSERT_TRUE(s.ok()) << s;
    for (size_t i = 0; i < block; ++i) {
      ASSERT_EQ(data[r * block + i], expected[r * block + i]) << "rank " << r << " i " << i;
    }
  });
}

TEST_P(RingAlgorithmsTest, AllGatherEqualBlocks) {
  const size_t block = count_;  // bytes per rank
  RunRankThreads(world_, [&](int r) {
    std::vector<uint8_t> data(world_ * block, 0xEE);  // [world, block]
    for (size_t i = 0; i < block; ++i) data[r * block + i] = ByteInput(r, i);
    absl::Status s = RingAllGather(*transports_[r], absl::MakeSpan(data), Deadline());
    ASSERT_TRUE(s.ok()) << s;
    for (int owner = 0; owner < world_; ++owner)
      for (size_t i = 0; i < block; ++i)
        ASSERT_EQ(data[owner * block + i], ByteInput(owner, i)) << "rank " << r;
  });
}

TEST_P(RingAlgorithmsTest, AllGatherUnequalBlocks) {
  std::vector<size_t> lengths(world_);  // bytes of each rank's block; some are 0
  for (int i = 0; i < world_; ++i) lengths[i] = i % 3 == 1 ? 0 : count_ / (i + 1) + i;
  const std::vector<Range> blocks = BlocksFromLengths(lengths);
  RunRankThreads(world_, [&](int r) {
    std::vector<uint8_t> data(TotalLength(lengths), 0xEE);  // [sum(lengths)]
    for (size_t i = 0; i < lengths[r]; ++i) data[blocks[r].begin + i] = ByteInput(r, i);
    absl::Status s = RingAllGatherV(*transports_[r], absl::MakeSpan(data), lengths, Deadline());
    ASSERT_TRUE(s.ok()) << s;
    for (int owner = 0; owner < world_; ++owner)
      for (size_t i = 0; i < lengths[owner]; ++i)
        ASSERT_EQ(data[blocks[owner].begin + i], ByteInput(owner, i)) << "rank " << r;
  });
}

TEST_P(RingAlgorithmsTest, BroadcastFromRoot) {
  const int root = world_ / 2;
  RunRankThreads(world_, [&](int r) {
    std::vector<uint8_t> data(count_, 0xEE);  // [count]
    if (r == root)
      for (size_t i = 0; i < count_; ++i) data[i] = ByteInput(root, i);
    absl::Status s = RingBroadcast(*transports_[r], root, absl::MakeSpan(data), Deadline());
    ASSERT_TRUE(s.ok()) << s;
    for (size_t i = 0; i < count_; ++i) ASSERT_EQ(data[i], ByteInput(root, i)) << "rank " << r;
  });
}

// Bytes rank `src` sends to rank `dst`: uneven, sometimes zero.
size_t PairBytes(int src, int dst, size_t count) {
  return (src + 2 * dst) % 4 == 3 ? 0 : count / (1 + (src + dst) % 3) + src;
}

TEST_P(RingAlgorithmsTest, AllToAllUneven) {
  RunRankThreads(world_, [&](int r) {
    std::vector<size_t> send(world_), recv(world_);  // [world] bytes per peer
    for (int j = 0; j < world_; ++j) {
      send[j] = PairBytes(r, j, count_);
      recv[j] = PairBytes(j, r, count_);
    }
    std::vector<uint8_t> in(TotalLength(send));         // [sum(send)]
    std::vector<uint8_t> out(TotalLength(recv), 0xEE);  // [sum(recv)]
    std::vector<Range> in_blocks = BlocksFromLengths(send);
    std::vector<Range> out_blocks = BlocksFromLengths(recv);
    for (int j = 0; j < world_; ++j)
      for (size_t i = 0; i < send[j]; ++i) in[in_blocks[j].begin + i] = ByteInput(r * 31 + j, i);
    absl::Status s = AllToAll(*transports_[r], in, send, absl::MakeSpan(out), recv, Deadline());
    ASSERT_TRUE(s.ok()) << s;
    for (int src = 0; src < world_; ++src)
      for (size_t i = 0; i < recv[src]; ++i)
        ASSERT_EQ(out[out_blocks[src].begin + i], ByteInput(src * 31 + r, i))
            << "rank " << r << " from " << src;
  });
}

std::string ParamName(const ::testing::TestParamInfo<std::tuple<Kind, int, size_t>>& info) {
  return std::string(std::get<0>(info.param) == Kind::kTcp ? "Tcp" : "InMemory") + "_W" +
         std::to_string(std::get<1>(info.param)) + "_N" + std::to_string(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(All, RingAlgorithmsTest,
                         ::testing::Combine(::testing::Values(Kind::kInMemory, Kind::kTcp),
                                            ::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values(size_t{0}, size_t{1}, kPrime,
                                                              kLarge)),
                         ParamName);

// Tiny segments: many segments per step, uneven per block, over real TCP.
TEST(RingAlgorithmsSegmentsTest, SmallSegmentsAllReduceAndBroadcast) {
  constexpr int kWorld = 3;
  auto store = c10::make_intrusive<c10d::HashStore>();
  TcpMeshOptions options;
  options.group_key = test_support::UniqueKey("seg");
  auto meshes = test_support::ConnectAll(*store, kWorld, options);
  ASSERT_TRUE(meshes.ok()) << meshes.status();
  RingOptions ring;
  ring.max_segment_bytes = 60;               // 15 floats, not a divisor of anything here
  std::vector<float> expected(kPrime, 0.f);  // [kPrime]
  for (int r = 0; r < kWorld; ++r)
    for (size_t i = 0; i < kPrime; ++i) expected[i] += FloatInput(r, i);
  RunRankThreads(kWorld, [&](int r) {
    std::vector<float> data(kPrime);  // [kPrime]
    for (size_t i = 0; i < kPrime; ++i) data[i] = FloatInput(r, i);
    absl::Time deadline = absl::Now() + absl::Seconds(30);
    absl::Status s = RingAllReduce(*(*meshes)[r], AsBytes(data), sizeof(float), SumReducer<float>(),
                                   deadline, ring);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(data, expected);
    std::vector<uint8_t> bytes(kPrime, r == 1 ? 0 : 0xEE);  // [kPrime]
    if (r == 1)
      for (size_t i = 0; i < kPrime; ++i) bytes[i] = ByteInput(1, i);
    s = RingBroadcast(*(*meshes)[r], 1, absl::MakeSpan(bytes), deadline, ring);
    ASSERT_TRUE(s.ok()) << s;
    for (size_t i = 0; i < kPrime; ++i) ASSERT_EQ(bytes[i], ByteInput(1, i));
  });
}

TEST(RingAlgorithmsArgsTest, RejectsBadSizes) {
  InMemoryHub hub(2);
  std::vector<uint8_t> data(7);
  absl::Time deadline = absl::Now() + absl::Seconds(1);
  EXPECT_EQ(RingAllReduce(hub.transport(0), absl::MakeSpan(data), 4, SumReducer<float>(), deadline)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RingAllGather(hub.transport(0), absl::MakeSpan(data), deadline).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RingBroadcast(hub.transport(0), 2, absl::MakeSpan(data), deadline).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tpudist::collectives::tcp
