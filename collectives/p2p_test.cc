// send/recv through the process group: order per (peer, tag), interleaved
// tags, irecv before isend, 0-byte and multi-MiB messages, both ranks
// sending first, Gloo's bytes as the oracle, a peer that dies, and abort() of
// a send blocked on a peer that does not read. Parameterized over one host
// ("00": shared memory, shm/p2p.h) and two emulated hosts ("01": host id per
// rank, TcpP2p over loopback, collectives/tcp/tcp_p2p.h). The job-secret and
// stranger tests are TcpP2p's: on one host they turn Options::shm_p2p off.
#include <ATen/ATen.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <string>
#include <vector>

#include "collectives/process_group_tpu_dist.h"
#include "collectives/tcp/tcp_socket.h"
#include "testing/collectives_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using test_support::ErrorOf;
using test_support::RunForked;
using test_support::RunRankThreads;
using test_support::SecondsSince;
using test_support::ShmEntries;
using test_support::UniqueJob;
using Clock = std::chrono::steady_clock;

// `hosts[r]` is rank r's emulated host.
ProcessGroupTpuDist::Options P2pOptions(const std::string& job, const std::string& hosts,
                                        int rank) {
  auto o = test_support::SmallOptions(job);
  o.host_id = std::string("p2ph") + hosts[rank];
  o.bind_address = "127.0.0.1";
  o.timeout = std::chrono::seconds(20);
  return o;
}

// Distinct contents per (sender, tag, index, element).
at::Tensor Message(int src, int tag, int index, int64_t numel) {
  return at::arange(numel, at::kInt) * 7 + (src * 1000003 + tag * 10007 + index * 31);
}

class P2pTest : public ::testing::TestWithParam<std::string> {};

// Rank 0 sends 40 messages on each of tags 1 and 2, interleaved, sizes from
// 0 bytes to 3 MiB (past any socket buffer); rank 1 takes all of tag 2
// first, then tag 1. Each must come in its send order with its bytes.
TEST_P(P2pTest, ManyMessagesInOrderPerTagAcrossInterleavedTags) {
  const std::string hosts = GetParam();
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("p2po");
  constexpr int kMessages = 40;
  auto numel = [](int i) -> int64_t { return i % 10 == 0 ? 0 : i % 10 == 5 ? 786432 : i * 13; };
  RunRankThreads(2, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, P2pOptions(job, hosts, rank));
    if (rank == 0) {
      for (int i = 0; i < kMessages; ++i) {
        for (int tag : {1, 2}) {
          std::vector<at::Tensor> t = {Message(0, tag, i, numel(i))};
          pg->send(t, 1, tag)->wait();
        }
      }
    } else {
      for (int tag : {2, 1}) {
        for (int i = 0; i < kMessages; ++i) {
          std::vector<at::Tensor> t = {at::full({numel(i)}, -1, at::kInt)};
          pg->recv(t, 0, tag)->wait();
          ASSERT_TRUE(at::equal(t[0], Message(0, tag, i, numel(i)))) << "tag " << tag << " #" << i;
        }
      }
    }
    pg->barrier()->wait();
  });
}

// Both ranks post irecv before isend, then both isend 8 MiB before they
// irecv: neither order may deadlock (the receiver drains into its queues).
TEST_P(P2pTest, IrecvFirstAndBothSendFirstLargeDoNotDeadlock) {
  const std::string hosts = GetParam();
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("p2pd");
  const auto start = Clock::now();
  RunRankThreads(2, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, P2pOptions(job, hosts, rank));
    const int peer = 1 - rank;
    const int64_t big = 2 << 20;  // ints: 8 MiB
    std::vector<at::Tensor> in = {at::empty({big}, at::kInt)};
    std::vector<at::Tensor> out = {Message(rank, 5, 0, big)};
    auto r = pg->recv(in, peer, 5);
    pg->send(out, peer, 5)->wait();
    r->wait();
    EXPECT_TRUE(at::equal(in[0], Message(peer, 5, 0, big)));
    std::vector<at::Tensor> out2 = {Message(rank, 6, 1, big)};
    pg->send(out2, peer, 6)->wait();
    pg->recv(in, peer, 6)->wait();
    EXPECT_TRUE(at::equal(in[0], Message(peer, 6, 1, big)));
    // Non-contiguous in and out.
    at::Tensor strided_out = Message(rank, 7, 2, 200).view({20, 10}).t();
    std::vector<at::Tensor> s = {strided_out};
    at::Tensor dst = at::empty({20, 10}, at::kInt).t();
    std::vector<at::Tensor> d = {dst};
    pg->send(s, peer, 7)->wait();
    pg->recv(d, peer, 7)->wait();
    EXPECT_TRUE(at::equal(dst, Message(peer, 7, 2, 200).view({20, 10}).t()));
  });
  EXPECT_LT(SecondsSince(start), 15.0);
}

// Oracle: Gloo's send/recv over the same ranks delivers the same bytes, for
// a ring of 3 ranks, on two tags, 0 B .. 1 MiB, float64 and bfloat16.
TEST_P(P2pTest, SameBytesAsGloo) {
  const std::string hosts = GetParam() + GetParam().back();  // 3 ranks
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("p2pg");
  RunRankThreads(3, [&](int rank) {
    auto ours = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 3, P2pOptions(job, hosts, rank));
    auto gloo = test_support::MakeGloo(store, rank, 3);
    const int next = (rank + 1) % 3, prev = (rank + 2) % 3;
    for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{4099}, int64_t{131072}}) {
      for (at::ScalarType type : {at::kDouble, at::kBFloat16}) {
        at::Tensor src = at::randn({numel}, at::TensorOptions(type)) + rank;  // [numel]
        std::vector<at::Tensor> s = {src};
        std::vector<at::Tensor> a = {at::empty({numel}, type)}, b = {at::empty({numel}, type)};
        for (int tag : {0, 9}) {
          auto w = ours->send(s, next, tag);
          ours->recv(a, prev, tag)->wait();
          w->wait();
          auto g = gloo->send(s, next, tag);
          gloo->recv(b, prev, tag)->wait();
          g->wait();
          EXPECT_TRUE(at::equal(a[0], b[0])) << numel << " " << type << " tag " << tag;
        }
      }
    }
  });
}

// A recv whose size differs from the message fails naming both sizes; a
// recv nobody sends to times out naming the peer and tag, within its timeout.
TEST_P(P2pTest, SizeMismatchAndTimeoutNameThePeer) {
  const std::string hosts = GetParam();
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("p2pm");
  std::atomic<bool> done{false};  // rank 0 keeps its group until rank 1 is done
  RunRankThreads(2, [&](int rank) {
    auto o = P2pOptions(job, hosts, rank);
    o.timeout = std::chrono::seconds(2);
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, o);
    if (rank == 0) {
      std::vector<at::Tensor> t = {at::ones({10})};
      pg->send(t, 1, 3)->wait();
      while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } else {
      std::vector<at::Tensor> t = {at::ones({11})};
      const std::string err = ErrorOf(pg->recv(t, 0, 3));
      EXPECT_THAT(err, HasSubstr("expected 44 bytes, the sender sent 40"));
      EXPECT_THAT(err, HasSubstr("peer rank 0"));
      const auto start = Clock::now();
      const std::string late = ErrorOf(pg->recv(t, 0, 4));
      EXPECT_THAT(late, HasSubstr("p2p rank 1"));
      EXPECT_THAT(late, HasSubstr("recv from peer rank 0 (tag 4, 44 bytes) timed out"));
      EXPECT_LT(SecondsSince(start), 4.0);
      done = true;
    }
  });
}

// Ranks given different job secrets: the connection is refused and the send
// says why.
TEST_P(P2pTest, DifferentJobSecretIsRefused) {
  const std::string hosts = GetParam();
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("p2ps");
  RunRankThreads(2, [&](int rank) {
    auto o = P2pOptions(job, hosts, rank);
    o.timeout = std::chrono::seconds(3);
    o.shm_p2p = false;
    o.job_secret = rank == 0 ? "secret-a" : "secret-b";
    if (hosts == "01") o.job_secret = "same";  // the mesh itself needs one secret
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, o);
    if (hosts == "01") return;  // covered on one host only
    if (rank == 0) {
      std::vector<at::Tensor> t = {at::ones({4})};
      EXPECT_THAT(ErrorOf(pg->send(t, 1, 0)), HasSubstr("failed to prove the job secret"));
    }
    pg->barrier()->wait();
  });
}

// A stranger dials rank 1's p2p port (address from the store) and sends
// garbage that claims to be rank 0: rank 1 drops it (one stderr line) and
// the real rank 0's messages still arrive.
TEST_P(P2pTest, StrangerOnThePortIsDroppedAndRealPeerServed) {
  const std::string hosts = GetParam();
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("p2px");
  std::atomic<bool> stranger_done{false};
  RunRankThreads(2, [&](int rank) {
    auto o = P2pOptions(job, hosts, rank);
    o.shm_p2p = false;
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, o);
    if (rank == 0) {
      const std::vector<uint8_t> v = store->get("tpu_dist/default/g1/p2p/addr/1");
      auto hp = tcp::SplitHostPort(std::string(v.begin(), v.end()));
      ASSERT_TRUE(hp.ok()) << hp.status();
      auto fd = tcp::ConnectUntil(hp->first, hp->second, absl::Now() + absl::Seconds(5));
      ASSERT_TRUE(fd.ok()) << fd.status();
      std::vector<uint8_t> garbage(300, 0x5a);
      ASSERT_TRUE(tcp::WriteAll(fd->get(), garbage, absl::Now() + absl::Seconds(5)).ok());
      stranger_done = true;
      std::vector<at::Tensor> t = {Message(0, 1, 0, 1000)};
      pg->send(t, 1, 1)->wait();
    } else {
      while (!stranger_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::vector<at::Tensor> t = {at::empty({1000}, at::kInt)};
      pg->recv(t, 0, 1)->wait();
      EXPECT_TRUE(at::equal(t[0], Message(0, 1, 0, 1000)));
    }
    pg->barrier()->wait();
  });
}

// Rank 1 sends one message and dies (_exit; its sockets closed by the kernel,
// or, on one host, its ring left with the message in it): rank 0 gets that
// message, then its next recv from rank 1 fails naming it ("closed" over
// TCP, "died" over shm), long before the 30 s timeout. /dev/shm is clean
// afterwards.
TEST_P(P2pTest, PeerThatDiesFailsRecvNamingIt) {
  const std::string hosts = GetParam();
  const std::string dir = test_support::ProcessTempDir("tpud_test");
  const std::string job = UniqueJob("p2pk");
  const std::vector<int> codes = RunForked(
      2,
      [&](int rank) {
        auto store = c10::make_intrusive<c10d::FileStore>(dir + "/store", 2);
        auto o = P2pOptions(job, hosts, rank);
        o.timeout = std::chrono::seconds(30);
        auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, o);
        if (rank == 1) {
          std::vector<at::Tensor> t = {at::full({3}, 5.0f)};
          pg->send(t, 0, 1)->wait();
          _exit(0);
        }
        std::vector<at::Tensor> t = {at::empty({3})};
        pg->recv(t, 1, 1)->wait();
        if (!at::equal(t[0], at::full({3}, 5.0f))) return 1;
        const auto start = Clock::now();
        const std::string err = ErrorOf(pg->recv(t, 1, 1));
        if (err.find("peer rank 1") == std::string::npos) return 2;
        if (err.find(hosts == "00" ? "died" : "closed") == std::string::npos) return 3;
        if (SecondsSince(start) > 10.0) return 4;
        return 0;
      },
      std::chrono::seconds(60));
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_THAT(ShmEntries("tpud_" + job), IsEmpty());
}

// Rank 1 connects, then stops (SIGSTOP) without reading; rank 0's 256 MiB
// send blocks once the socket buffers (one host: rank 1's ring) are full. abort() from another thread
// must fail that send within seconds (not at its 20 s timeout) and say it
// was aborted. Rank 0 then kills the stopped rank 1.
TEST_P(P2pTest, AbortInterruptsASendBlockedOnAPeerThatDoesNotRead) {
  const std::string hosts = GetParam();
  const std::string dir = test_support::ProcessTempDir("tpud_test");
  const std::string job = UniqueJob("p2pa");
  const std::vector<int> codes = RunForked(
      2,
      [&](int rank) {
        auto store = c10::make_intrusive<c10d::FileStore>(dir + "/store", 2);
        auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2,
                                                           P2pOptions(job, hosts, rank));
        std::vector<at::Tensor> small = {at::ones({4})};
        if (rank == 1) {
          pg->recv(small, 0, 1)->wait();  // the 0 -> 1 connection is up
          const std::string pid = std::to_string(getpid());
          store->set("pid1", std::vector<uint8_t>(pid.begin(), pid.end()));
          raise(SIGSTOP);
          pause();  // killed by rank 0
          return 9;
        }
        pg->send(small, 1, 1)->wait();
        const std::vector<uint8_t> v = store->get("pid1");
        const pid_t pid1 = std::stoi(std::string(v.begin(), v.end()));
        std::vector<at::Tensor> big = {at::zeros({64 << 20})};  // 256 MiB
        std::thread aborter([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          pg->abort();
        });
        const auto start = Clock::now();
        const std::string err = ErrorOf(pg->send(big, 1, 2));
        const double took = SecondsSince(start);
        aborter.join();
        kill(pid1, SIGKILL);
        if (err.find("abort") == std::string::npos) return 1;
        if (err.find("peer rank 1") == std::string::npos) return 2;
        if (took > 5.0) return 3;
        return 0;
      },
      std::chrono::seconds(60));
  EXPECT_EQ(codes[0], 0);
  EXPECT_THAT(ShmEntries("tpud_" + job), IsEmpty());
}

// 2 emulated hosts x 2 ranks: every rank sends two messages (4 B and
// 3 MiB, past a 1 MiB ring and the socket buffers) to every other rank
// before receiving any, so pairs on one host go through shm and the others
// over TCP in the same group; every message arrives intact.
TEST(P2pMixedTest, SameHostPairsOverShmOthersOverTcpInOneGroup) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("p2pmix");
  RunRankThreads(4, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 4,
                                                       P2pOptions(job, "0011", rank));
    for (int64_t numel : {int64_t{1}, int64_t{786432}}) {
      for (int dst = 0; dst < 4; ++dst) {
        if (dst == rank) continue;
        std::vector<at::Tensor> t = {Message(rank, dst, static_cast<int>(numel % 7), numel)};
        pg->send(t, dst, 3)->wait();
      }
    }
    for (int src = 0; src < 4; ++src) {
      if (src == rank) continue;
      for (int64_t numel : {int64_t{1}, int64_t{786432}}) {
        std::vector<at::Tensor> t = {at::empty({numel}, at::kInt)};
        pg->recv(t, src, 3)->wait();
        EXPECT_TRUE(at::equal(t[0], Message(src, rank, static_cast<int>(numel % 7), numel)))
            << "from " << src << " numel " << numel;
      }
    }
    pg->barrier()->wait();
  });
}

INSTANTIATE_TEST_SUITE_P(Hosts, P2pTest, ::testing::Values("00", "01"),
                         [](const auto& info) {
                           return info.param == "00" ? std::string("OneHost")
                                                     : std::string("TwoHosts");
                         });

}  // namespace
}  // namespace tpudist::collectives
