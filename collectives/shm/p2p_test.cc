// ShmP2p (shm/p2p.h) on its own, ranks as threads over a HashStore with
// 4 KiB rings, so most messages wrap and stream through a ring in pieces:
// order per (peer, tag) with every rank sending to every other before any
// receives, a Recv posted before its message, wrong sizes, deadlines on
// both sides (a receiver that never drains, a frame that stops arriving),
// a broken stream, Abort. A dying peer and a stopped one are covered through
// the process group (collectives/p2p_test.cc, OneHost).
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "collectives/shm/communicator.h"
#include "collectives/shm/p2p.h"
#include "collectives/shm/p2p_ring.h"
#include "collectives/shm/wait.h"
#include "testing/collectives_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"

namespace tpudist::collectives::shm {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kRingBytes = 4096;

std::unique_ptr<Communicator> Create(c10d::Store& store, const std::string& job, int rank,
                                     int world) {
  CommOptions options;
  options.job_id = job;
  options.p2p_ring_bytes = kRingBytes;
  return test_support::CreateShmComm(store, rank, world, options);
}

// Distinct bytes per (sender, receiver, tag, index, offset).
std::vector<uint8_t> Payload(int src, int dst, int tag, int index, size_t size) {
  std::vector<uint8_t> v(size);
  for (size_t i = 0; i < size; ++i) {
    v[i] = static_cast<uint8_t>(src * 131 + dst * 71 + tag * 29 + index * 7 + i * 13 + (i >> 8));
  }
  return v;
}

absl::Time In(int ms) { return absl::Now() + absl::Milliseconds(ms); }

// Spins until `flag` is set (a peer finished what the test waits for).
void Await(const std::atomic<bool>& flag) {
  while (!flag.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Every rank sends all its messages (sizes around the frame header and the
// ring size, up to 25 rings' worth, on two tags, interleaved) to every other
// rank before receiving anything: the readers must drain into queues, or
// the senders would block on full rings forever. Each receiver then takes
// tag 2 before tag 1; each message must come in send order, intact.
TEST(ShmP2pTest, EveryRankSendsFirstAndAllArriveInOrderPerTag) {
  constexpr int kWorld = 3;
  const std::vector<size_t> sizes = {0, 1, 15, 16, 17, 4095, 4096, 4097, 100000, 3};
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = test_support::UniqueJob("shmp2p");
  std::atomic<int> done{0};
  test_support::RunRankThreads(kWorld, [&](int rank) {
    std::unique_ptr<Communicator> comm = Create(*store, job, rank, kWorld);
    ASSERT_NE(comm, nullptr);
    ShmP2p p2p(comm.get());
    for (size_t i = 0; i < sizes.size(); ++i) {
      for (int tag : {1, 2}) {
        for (int dst = 0; dst < kWorld; ++dst) {
          if (dst == rank) continue;
          const std::vector<uint8_t> m = Payload(rank, dst, tag, static_cast<int>(i), sizes[i]);
          ASSERT_TRUE(p2p.Send(dst, tag, m, In(20000)).ok());
        }
      }
    }
    for (int src = 0; src < kWorld; ++src) {
      if (src == rank) continue;
      for (int tag : {2, 1}) {
        for (size_t i = 0; i < sizes.size(); ++i) {
          std::vector<uint8_t> got(sizes[i], 0xee);
          absl::Status s = p2p.Recv(src, tag, absl::MakeSpan(got), In(20000));
          ASSERT_TRUE(s.ok()) << s;
          EXPECT_EQ(got, Payload(src, rank, tag, static_cast<int>(i), sizes[i]))
              << "from " << src << " tag " << tag << " message " << i;
        }
      }
    }
    ++done;
    while (done.load() < kWorld) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
}

// Rank 1 posts its Recv (1 MiB, 256 rings) long before rank 0 sends: the
// reader copies the message straight into it; a message of the same tag
// already queued goes first (the second Recv gets the second message).
TEST(ShmP2pTest, RecvPostedFirstIsFilledAndQueuedMessagesKeepTheirOrder) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = test_support::UniqueJob("shmp2pp");
  std::atomic<bool> posted{false}, received{false};
  test_support::RunRankThreads(2, [&](int rank) {
    std::unique_ptr<Communicator> comm = Create(*store, job, rank, 2);
    ASSERT_NE(comm, nullptr);
    ShmP2p p2p(comm.get());
    const std::vector<uint8_t> big = Payload(0, 1, 5, 0, 1 << 20);
    if (rank == 0) {
      Await(posted);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ASSERT_TRUE(p2p.Send(1, 5, big, In(20000)).ok());
      for (int i = 1; i <= 2; ++i) {
        ASSERT_TRUE(p2p.Send(1, 6, Payload(0, 1, 6, i, 5000), In(20000)).ok());
      }
      Await(received);
      return;
    }
    std::vector<uint8_t> got(big.size());
    std::thread late([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      posted = true;
    });
    ASSERT_TRUE(p2p.Recv(0, 5, absl::MakeSpan(got), In(20000)).ok());
    late.join();
    EXPECT_EQ(got, big);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // both tag-6 messages queued
    for (int i = 1; i <= 2; ++i) {
      std::vector<uint8_t> m(5000);
      ASSERT_TRUE(p2p.Recv(0, 6, absl::MakeSpan(m), In(20000)).ok());
      EXPECT_EQ(m, Payload(0, 1, 6, i, 5000)) << i;
    }
    received = true;
  });
}

// A Recv of the wrong size fails naming both sizes and consumes the
// message; a Recv nothing arrives for fails at its deadline naming the peer
// and the tag; Abort ends a waiting Recv with its status.
TEST(ShmP2pTest, WrongSizeAndDeadlineNameThePeer) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = test_support::UniqueJob("shmp2pw");
  std::atomic<bool> finished{false};
  test_support::RunRankThreads(2, [&](int rank) {
    std::unique_ptr<Communicator> comm = Create(*store, job, rank, 2);
    ASSERT_NE(comm, nullptr);
    ShmP2p p2p(comm.get());
    if (rank == 0) {
      ASSERT_TRUE(p2p.Send(1, 3, Payload(0, 1, 3, 0, 40), In(5000)).ok());
      ASSERT_TRUE(p2p.Send(1, 3, Payload(0, 1, 3, 1, 44), In(5000)).ok());
      Await(finished);
      return;
    }
    std::vector<uint8_t> m(44);
    absl::Status s = p2p.Recv(0, 3, absl::MakeSpan(m), In(5000));
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("expected 44 bytes, the sender sent 40"));
    EXPECT_THAT(s.message(), HasSubstr("peer rank 0"));
    ASSERT_TRUE(p2p.Recv(0, 3, absl::MakeSpan(m), In(5000)).ok());
    EXPECT_EQ(m, Payload(0, 1, 3, 1, 44));
    const absl::Time start = absl::Now();
    s = p2p.Recv(0, 4, absl::MakeSpan(m), In(200));
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("shm p2p rank 1: recv from peer rank 0 (tag 4, 44 bytes)"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      p2p.Abort(absl::CancelledError("group destroyed"));
    });
    s = p2p.Recv(0, 9, absl::MakeSpan(m), In(20000));
    aborter.join();
    EXPECT_TRUE(absl::IsCancelled(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("group destroyed"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(3));
    finished = true;
  });
}

// Rank 1 runs no ShmP2p (nobody drains its rings): rank 0's 20000-byte
// Send fills the 4 KiB ring and fails at its deadline saying so; the frame is
// half written, so the next Send to rank 1 fails with the same status. An
// Abort fails a Send that waits on the full ring to rank 2 well before its
// deadline, and every later call.
TEST(ShmP2pTest, SendsToAFullRingFailAtTheDeadlineOrOnAbort) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = test_support::UniqueJob("shmp2pf");
  std::atomic<bool> finished{false};
  test_support::RunRankThreads(3, [&](int rank) {
    std::unique_ptr<Communicator> comm = Create(*store, job, rank, 3);
    ASSERT_NE(comm, nullptr);
    if (rank != 0) {
      Await(finished);
      return;
    }
    ShmP2p p2p(comm.get());
    const std::vector<uint8_t> m = Payload(0, 1, 1, 0, 20000);
    absl::Status s = p2p.Send(1, 1, m, In(200));
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("send to peer rank 1 (tag 1, 20000 bytes)"));
    EXPECT_THAT(s.message(), HasSubstr("ring full"));
    EXPECT_EQ(p2p.Send(1, 1, m, In(200)), s);
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      p2p.Abort(absl::AbortedError("test abort"));
    });
    const absl::Time start = absl::Now();
    s = p2p.Send(2, 1, m, In(20000));
    aborter.join();
    EXPECT_TRUE(absl::IsAborted(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("test abort"));
    EXPECT_THAT(s.message(), HasSubstr("peer rank 2"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
    std::vector<uint8_t> r(4);
    EXPECT_TRUE(absl::IsAborted(p2p.Recv(1, 1, absl::MakeSpan(r), In(20000))));
    finished = true;
  });
}

// Rank 0 writes frames into its ring to rank 1 by hand. A frame that stops
// after 100 of its 10000 bytes fails the Recv posted for it at that Recv's
// deadline; once the rest arrives it is dropped, and the next frame is
// delivered intact. Then a header with a bad magic: the stream is broken and
// Recvs from rank 0 fail saying so.
TEST(ShmP2pTest, StalledFramesFailTheirRecvAndABrokenStreamClosesThePeer) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = test_support::UniqueJob("shmp2ps");
  std::atomic<bool> stalled_failed{false}, finished{false};
  struct Header {
    uint32_t magic;
    int32_t tag;
    uint64_t bytes;
  };
  test_support::RunRankThreads(2, [&](int rank) {
    std::unique_ptr<Communicator> comm = Create(*store, job, rank, 2);
    ASSERT_NE(comm, nullptr);
    if (rank == 0) {
      P2pRing ring = comm->p2p_ring(0, 1);
      auto put = [&](const void* p, size_t n) {
        const char* c = static_cast<const char*>(p);
        while (n > 0) {
          const uint64_t w = ring.Write(c, n);
          c += w;
          n -= w;
          BumpSeq(comm->p2p_doorbell(1), comm->p2p_doorbell_waiters(1));
          if (w == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      };
      const std::vector<uint8_t> m = Payload(0, 1, 7, 0, 10000);
      const Header h{0x31703270, 7, m.size()};
      put(&h, sizeof(h));
      put(m.data(), 100);
      Await(stalled_failed);
      put(m.data() + 100, m.size() - 100);
      const std::vector<uint8_t> next = Payload(0, 1, 7, 1, 300);
      const Header h2{0x31703270, 7, next.size()};
      put(&h2, sizeof(h2));
      put(next.data(), next.size());
      const Header bad{0xdeadbeef, 7, 8};
      put(&bad, sizeof(bad));
      Await(finished);
      return;
    }
    ShmP2p p2p(comm.get());
    std::vector<uint8_t> got(10000);
    absl::Status s = p2p.Recv(0, 7, absl::MakeSpan(got), In(300));
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("recv from peer rank 0 (tag 7, 10000 bytes)"));
    EXPECT_THAT(s.message(), HasSubstr("100 of 10000 bytes arrived"));
    stalled_failed = true;
    std::vector<uint8_t> next(300);
    s = p2p.Recv(0, 7, absl::MakeSpan(next), In(5000));
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(next, Payload(0, 1, 7, 1, 300));
    s = p2p.Recv(0, 7, absl::MakeSpan(next), In(5000));
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("corrupt"));
    finished = true;
  });
}

}  // namespace
}  // namespace tpudist::collectives::shm
