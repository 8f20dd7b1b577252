// TcpMesh between threads of one process over a c10d::HashStore on
// 127.0.0.1: framing, full duplex under load, errors, poisoning, rendezvous
// failures.

#include "collectives/tcp/tcp_mesh.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "testing/tcp_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::collectives::tcp {
namespace {

using ::testing::AllOf;
using test_support::ByteInput;
using ::testing::HasSubstr;
using test_support::RunRankThreads;

class TcpMeshTest : public ::testing::Test {
 protected:
  std::vector<std::unique_ptr<TcpMesh>> Mesh(int world) {
    TcpMeshOptions options;
    options.group_key = test_support::UniqueKey("mesh");
    options.connect_timeout = absl::Seconds(20);
    auto meshes = test_support::ConnectAll(*store_, world, options);
    EXPECT_TRUE(meshes.ok()) << meshes.status();
    return meshes.ok() ? std::move(*meshes) : std::vector<std::unique_ptr<TcpMesh>>();
  }
  static absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

  c10::intrusive_ptr<c10d::HashStore> store_ = c10::make_intrusive<c10d::HashStore>();
};

TEST_F(TcpMeshTest, SizeOneNeedsNoPeers) {
  auto mesh = TcpMesh::Connect(*store_, 0, 1, TcpMeshOptions{});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ((*mesh)->size(), 1);
  std::vector<uint8_t> b(1);
  EXPECT_EQ((*mesh)->Send(0, b, Soon()).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TcpMeshTest, SendRecvInOrderIncludingEmptyMessages) {
  auto m = Mesh(2);
  ASSERT_EQ(m.size(), 2u);
  RunRankThreads(2, [&](int r) {
    if (r == 0) {
      for (size_t n : {0u, 1u, 7u, 0u, 100000u}) {
        std::vector<uint8_t> msg(n);
        for (size_t i = 0; i < n; ++i) msg[i] = ByteInput(static_cast<int>(n), i);
        ASSERT_TRUE(m[0]->Send(1, msg, Soon()).ok());
      }
    } else {
      for (size_t n : {0u, 1u, 7u, 0u, 100000u}) {
        std::vector<uint8_t> got(n, 0xEE);
        absl::Status s = m[1]->Recv(0, absl::MakeSpan(got), Soon());
        ASSERT_TRUE(s.ok()) << s;
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], ByteInput(static_cast<int>(n), i));
      }
    }
  });
}

// Every rank sends 8 MiB to its successor while receiving 8 MiB from its
// predecessor: larger than any socket buffer, so a half-duplex
// implementation would deadlock here (and fail at the deadline).
TEST_F(TcpMeshTest, RingSendRecvOfLargeBuffersDoesNotDeadlock) {
  for (int world : {2, 3}) {
    auto m = Mesh(world);
    ASSERT_EQ(m.size(), static_cast<size_t>(world));
    constexpr size_t kBytes = 8u << 20;
    RunRankThreads(world, [&](int r) {
      std::vector<uint8_t> out(kBytes), in(kBytes, 0);
      for (size_t i = 0; i < kBytes; i += 4093) out[i] = ByteInput(r, i);
      const int next = (r + 1) % world, prev = (r + world - 1) % world;
      absl::Status s = m[r]->SendRecv(next, out, prev, absl::MakeSpan(in), Soon());
      ASSERT_TRUE(s.ok()) << s;
      for (size_t i = 0; i < kBytes; i += 4093) ASSERT_EQ(in[i], ByteInput(prev, i));
    });
  }
}

TEST_F(TcpMeshTest, SizeMismatchIsReportedAndPoisons) {
  auto m = Mesh(2);
  ASSERT_EQ(m.size(), 2u);
  RunRankThreads(2, [&](int r) {
    if (r == 0) {
      std::vector<uint8_t> msg(16);
      ASSERT_TRUE(m[0]->Send(1, msg, Soon()).ok());
    } else {
      std::vector<uint8_t> got(8);
      absl::Status s = m[1]->Recv(0, absl::MakeSpan(got), Soon());
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_THAT(s.message(), AllOf(HasSubstr("rank 1"), HasSubstr("peer rank 0"),
                                     HasSubstr("16 bytes"), HasSubstr("expected seq 0 and 8")));
      absl::Status again = m[1]->Recv(0, absl::MakeSpan(got), Soon());
      EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
      EXPECT_THAT(again.message(), HasSubstr("poisoned"));
    }
  });
}

TEST_F(TcpMeshTest, DeadlineErrorNamesEverythingAndPeerSeesClosure) {
  auto m = Mesh(2);
  ASSERT_EQ(m.size(), 2u);
  std::vector<uint8_t> buf(1000);
  const absl::Time start = absl::Now();
  absl::Status s = m[0]->Recv(1, absl::MakeSpan(buf), start + absl::Milliseconds(200));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("rank 0"), HasSubstr("Recv from peer 1"),
                                 HasSubstr("received 0/1000 bytes"), HasSubstr("elapsed")));
  EXPECT_GE(took, absl::Milliseconds(190));
  EXPECT_LT(took, absl::Seconds(5));
  // Rank 0 poisoned itself and shut its sockets: rank 1 now fails fast.
  absl::Status peer = m[1]->Recv(0, absl::MakeSpan(buf), absl::Now() + absl::Seconds(10));
  EXPECT_EQ(peer.code(), absl::StatusCode::kUnavailable) << peer;
  EXPECT_THAT(peer.message(), HasSubstr("peer rank 0 closed the connection"));
}

TEST_F(TcpMeshTest, AbortMakesPeersFailWithUnavailable) {
  auto m = Mesh(3);
  ASSERT_EQ(m.size(), 3u);
  m[2]->Abort("test abort");
  std::vector<uint8_t> big(4u << 20);
  absl::Status recv = m[0]->Recv(2, absl::MakeSpan(big), Soon());
  EXPECT_EQ(recv.code(), absl::StatusCode::kUnavailable) << recv;
  EXPECT_THAT(recv.message(), HasSubstr("peer rank 2"));
  absl::Status send = m[1]->Send(2, big, Soon());
  EXPECT_EQ(send.code(), absl::StatusCode::kUnavailable) << send;
  EXPECT_THAT(send.message(), HasSubstr("peer rank 2"));
  EXPECT_EQ(m[2]->Send(0, big, Soon()).code(), absl::StatusCode::kFailedPrecondition);
}

// A watchdog thread aborts a mesh while its owner is blocked in Recv.
TEST_F(TcpMeshTest, AbortFromAnotherThreadInterruptsABlockedRecv) {
  auto m = Mesh(2);
  ASSERT_EQ(m.size(), 2u);
  std::vector<uint8_t> buf(64);
  std::thread watchdog([&] {
    absl::SleepFor(absl::Milliseconds(100));
    m[0]->Abort("watchdog");
  });
  const absl::Time start = absl::Now();
  absl::Status s = m[0]->Recv(1, absl::MakeSpan(buf), start + absl::Seconds(20));
  watchdog.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_THAT(s.message(), HasSubstr("watchdog"));
  EXPECT_EQ(m[0]->poison_status().code(), absl::StatusCode::kAborted);
}

// IPv6 loopback, if this machine has it.
TEST_F(TcpMeshTest, WorksOverIpv6Loopback) {
  auto probe = ListenTcp("::1", 0, 1);
  if (!probe.ok()) GTEST_SKIP() << "no IPv6 loopback: " << probe.status();
  TcpMeshOptions options;
  options.group_key = test_support::UniqueKey("v6");
  options.bind_address = "::1";
  options.connect_timeout = absl::Seconds(10);
  auto m = test_support::ConnectAll(*store_, 2, options);
  ASSERT_TRUE(m.ok()) << m.status();
  RunRankThreads(2, [&](int r) {
    std::vector<uint8_t> out(1000, static_cast<uint8_t>(r + 1)), in(1000);
    absl::Status s = (*m)[r]->SendRecv(1 - r, out, 1 - r, absl::MakeSpan(in), Soon());
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(in[999], 2 - r);
  });
}

TEST_F(TcpMeshTest, SendRecvOverlappedRunsWorkExactlyOnce) {
  auto m = Mesh(2);
  ASSERT_EQ(m.size(), 2u);
  std::vector<int> runs(2, 0);
  RunRankThreads(2, [&](int r) {
    std::vector<uint8_t> out(3u << 20, static_cast<uint8_t>(r + 1)), in(3u << 20);
    absl::Status s = m[r]->SendRecvOverlapped(
        1 - r, out, 1 - r, absl::MakeSpan(in), [&] { ++runs[r]; }, Soon());
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(in.back(), 2 - r);
  });
  EXPECT_EQ(runs, std::vector<int>({1, 1}));
  // Still exactly once when the call fails up front or in flight.
  std::vector<uint8_t> buf(8);
  int bad_peer_runs = 0;
  EXPECT_FALSE(m[0]->SendRecvOverlapped(
                       0, buf, 1, absl::MakeSpan(buf), [&] { ++bad_peer_runs; }, Soon())
                   .ok());
  EXPECT_EQ(bad_peer_runs, 1);
  int timeout_runs = 0;
  EXPECT_EQ(m[0]->SendRecvOverlapped(
                    1, buf, 1, absl::MakeSpan(buf), [&] { ++timeout_runs; },
                    absl::Now() + absl::Milliseconds(50))
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(timeout_runs, 1);
}

TEST_F(TcpMeshTest, InvalidPeerIsRejectedWithoutPoisoning) {
  auto m = Mesh(2);
  ASSERT_EQ(m.size(), 2u);
  std::vector<uint8_t> b(4);
  EXPECT_EQ(m[0]->Send(0, b, Soon()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m[0]->Send(2, b, Soon()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(m[0]->poison_status().ok());
}

TEST_F(TcpMeshTest, ConnectTimesOutNamingMissingRanks) {
  TcpMeshOptions options;
  options.group_key = test_support::UniqueKey("missing");
  options.connect_timeout = absl::Milliseconds(1500);
  // Ranks 0 and 1 of 3 show up; rank 2 never does.
  std::vector<absl::Status> status(2);
  const absl::Time start = absl::Now();
  RunRankThreads(2, [&](int r) { status[r] = TcpMesh::Connect(*store_, r, 3, options).status(); });
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded) << status[r];
    EXPECT_THAT(status[r].message(), HasSubstr("peer rank(s) 2 did not connect"));
  }
  // A rank whose lower ranks never publish an address.
  options.group_key = test_support::UniqueKey("alone");
  absl::Status alone = TcpMesh::Connect(*store_, 2, 3, options).status();
  EXPECT_EQ(alone.code(), absl::StatusCode::kDeadlineExceeded) << alone;
  EXPECT_THAT(alone.message(), HasSubstr("peer rank 0 never published its address"));
}

TEST_F(TcpMeshTest, HandshakeRejectsWorldSizeMismatch) {
  TcpMeshOptions options;
  options.group_key = test_support::UniqueKey("size");
  options.connect_timeout = absl::Seconds(3);
  std::vector<absl::Status> status(2);
  RunRankThreads(2, [&](int r) {
    status[r] = TcpMesh::Connect(*store_, r, r == 0 ? 2 : 3, options).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kFailedPrecondition) << status[r];
    EXPECT_THAT(status[r].message(), HasSubstr("world size"));
  }
}

// Something that is not a TcpMesh answers at rank 0's published address.
TEST_F(TcpMeshTest, HandshakeRejectsImpostor) {
  auto listener = ListenTcp("127.0.0.1", 0, 4);
  ASSERT_TRUE(listener.ok()) << listener.status();
  TcpMeshOptions options;
  options.group_key = test_support::UniqueKey("impostor");
  options.connect_timeout = absl::Seconds(3);
  const std::string addr = absl::StrCat("127.0.0.1:", listener->port);
  store_->set(options.group_key + "/tcp_mesh/addr/0",
              std::vector<uint8_t>(addr.begin(), addr.end()));
  std::thread impostor([&] {
    auto fd = AcceptUntil(listener->fd.get(), absl::Now() + absl::Seconds(3));
    if (!fd.ok()) return;
    const std::string junk = "HTTP/1.1 400 Bad Request\r\n\r\n";
    (void)WriteAll(fd->get(),
                   absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(junk.data()), junk.size()),
                   absl::Now() + absl::Seconds(1));
    absl::SleepFor(absl::Milliseconds(200));
  });
  absl::Status s = TcpMesh::Connect(*store_, 1, 2, options).status();
  impostor.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("rank 1"), HasSubstr("bad magic")));
}

TEST_F(TcpMeshTest, WildcardBindNeedsAdvertiseAddress) {
  TcpMeshOptions options;
  options.bind_address = "0.0.0.0";
  absl::Status s = TcpMesh::Connect(*store_, 0, 2, options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("advertise_address"));
}

TEST(SplitHostPortTest, ParsesV4V6AndRejectsJunk) {
  auto a = SplitHostPort("10.250.0.1:4242");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "10.250.0.1");
  EXPECT_EQ(a->second, 4242);
  auto b = SplitHostPort("[::1]:80");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->first, "::1");
  EXPECT_EQ(JoinHostPort("::1", 80), "[::1]:80");
  EXPECT_EQ(JoinHostPort("10.0.0.1", 5), "10.0.0.1:5");
  EXPECT_FALSE(SplitHostPort("nohost").ok());
  EXPECT_FALSE(SplitHostPort("h:0").ok());
  EXPECT_FALSE(SplitHostPort("h:99999").ok());
}

}  // namespace
}  // namespace tpudist::collectives::tcp
