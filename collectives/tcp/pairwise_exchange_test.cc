// PairwiseExchange against the directly computed expectation, over both
// transports, W in {1, 2, 3, 5}, uneven (sometimes empty) blocks, with and
// without excluded peers ("hosts" of non-contiguous ranks): included blocks
// arrive byte-exact, excluded and own blocks are left untouched.

#include "collectives/tcp/pairwise_exchange.h"

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

using test_support::ByteInput;
using test_support::RunRankThreads;

enum class Kind { kInMemory, kTcp };

constexpr uint8_t kUntouched = 0xEE;

// Bytes rank `src` sends to rank `dst`: uneven, zero for some pairs.
size_t PairBytes(int src, int dst, size_t count) {
  return (3 * src + dst) % 5 == 2 ? 0 : count + 17 * src + 5 * dst;
}

// Emulated host of a rank: ranks alternate between two hosts (not
// contiguous), so the exclusion mask is not a block pattern.
int HostOf(int rank) { return rank % 2; }

class PairwiseExchangeTest
    : public ::testing::TestWithParam<std::tuple<Kind, int, bool, size_t>> {
 protected:
  void SetUp() override {
    world_ = std::get<1>(GetParam());
    if (std::get<0>(GetParam()) == Kind::kTcp) {
      store_ = c10::make_intrusive<c10d::HashStore>();
      TcpMeshOptions options;
      options.group_key = test_support::UniqueKey("pairwise");
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

  int world_ = 0;
  c10::intrusive_ptr<c10d::HashStore> store_;
  std::vector<std::unique_ptr<TcpMesh>> meshes_;
  std::unique_ptr<InMemoryHub> hub_;
  std::vector<Transport*> transports_;  // [world]
};

TEST_P(PairwiseExchangeTest, MovesIncludedBlocksOnly) {
  const bool cross_host_only = std::get<2>(GetParam());
  const size_t count = std::get<3>(GetParam());
  RunRankThreads(world_, [&](int r) {
    // One separate buffer per peer, as tensors' blocks would be.
    std::vector<std::vector<uint8_t>> in(world_), out(world_);  // world x [bytes]
    std::vector<absl::Span<const uint8_t>> send(world_);
    std::vector<absl::Span<uint8_t>> recv(world_);
    std::vector<bool> include(world_);
    for (int p = 0; p < world_; ++p) {
      in[p].resize(PairBytes(r, p, count));
      for (size_t i = 0; i < in[p].size(); ++i) in[p][i] = ByteInput(r * 31 + p, i);
      out[p].assign(PairBytes(p, r, count), kUntouched);
      send[p] = in[p];
      recv[p] = absl::MakeSpan(out[p]);
      include[p] = p != r && (!cross_host_only || HostOf(p) != HostOf(r));
    }
    std::unique_ptr<bool[]> flags(new bool[world_]);
    for (int p = 0; p < world_; ++p) flags[p] = include[p];
    absl::Status s = PairwiseExchange(*transports_[r], send, recv,
                                      absl::MakeConstSpan(flags.get(), world_),
                                      absl::Now() + absl::Seconds(60));
    ASSERT_TRUE(s.ok()) << s;
    for (int src = 0; src < world_; ++src) {
      for (size_t i = 0; i < out[src].size(); ++i) {
        const uint8_t want = include[src] ? ByteInput(src * 31 + r, i) : kUntouched;
        ASSERT_EQ(out[src][i], want) << "rank " << r << " from " << src << " byte " << i;
      }
    }
  });
}

std::string ParamName(
    const ::testing::TestParamInfo<std::tuple<Kind, int, bool, size_t>>& info) {
  return std::string(std::get<0>(info.param) == Kind::kTcp ? "Tcp" : "InMemory") + "_W" +
         std::to_string(std::get<1>(info.param)) +
         (std::get<2>(info.param) ? "_CrossHost" : "_All") + "_N" +
         std::to_string(std::get<3>(info.param));
}

INSTANTIATE_TEST_SUITE_P(All, PairwiseExchangeTest,
                         ::testing::Combine(::testing::Values(Kind::kInMemory, Kind::kTcp),
                                            ::testing::Values(1, 2, 3, 5),
                                            ::testing::Bool(),
                                            ::testing::Values(size_t{0}, size_t{1} << 20)),
                         ParamName);

TEST(PairwiseExchangeArgsTest, RejectsWrongBlockCount) {
  InMemoryHub hub(2);
  std::vector<absl::Span<const uint8_t>> send(1);
  std::vector<absl::Span<uint8_t>> recv(2);
  bool flags[2] = {false, true};
  absl::Status s = PairwiseExchange(hub.transport(0), send, recv, flags,
                                    absl::Now() + absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

// TcpMesh::Exchange (every block at once): a receiver expecting a different
// size than its peer sends fails with the frame check, naming the peer; a
// repeated peer is rejected before any I/O.
TEST(TcpExchangeTest, SizeMismatchAndRepeatedPeerAreReported) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  TcpMeshOptions options;
  options.group_key = test_support::UniqueKey("exchange");
  auto meshes = test_support::ConnectAll(*store, 3, options);
  ASSERT_TRUE(meshes.ok()) << meshes.status();
  std::vector<uint8_t> a(64, 1), b(64, 2);  // [64] each
  const SendBlock twice[2] = {{1, a}, {1, b}};
  absl::Status s = (*meshes)[0]->Exchange(twice, {}, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  RunRankThreads(3, [&](int r) {
    std::vector<uint8_t> out(r == 2 ? 32 : 100);  // rank 2 expects 32 of rank 0's 100 bytes
    std::vector<uint8_t> in(100, static_cast<uint8_t>(r));
    std::vector<SendBlock> sends;
    std::vector<RecvBlock> recvs;
    if (r == 0) sends = {{1, in}, {2, in}};
    if (r != 0) recvs = {{0, absl::MakeSpan(out)}};
    absl::Status st = (*meshes)[r]->Exchange(sends, recvs, absl::Now() + absl::Seconds(10));
    if (r == 1) EXPECT_TRUE(st.ok()) << st;
    if (r == 2) {
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
      EXPECT_NE(st.message().find("frame from peer rank 0"), absl::string_view::npos) << st;
    }
  });
}

}  // namespace
}  // namespace tpudist::collectives::tcp
