// Unit tests of the shm building blocks: segment naming and lifecycle, and
// the spin / yield / futex wait (the reduction kernels are tested in
// collectives/core/reduce_kernels_test.cc).
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "collectives/shm/communicator.h"
#include "collectives/shm/placement.h"
#include "collectives/shm/segment.h"
#include "collectives/shm/wait.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::collectives::shm {
namespace {

TEST(SegmentTest, NamesAreSanitized) {
  EXPECT_EQ(SegmentName("job1", "default", 3), "/tpud_job1_default_3");
  EXPECT_EQ(SegmentName("a/b c", "g:1*", 0), "/tpud_a_b_c_g_1__0");
  EXPECT_LT(SegmentName(std::string(500, 'j'), std::string(500, 'g'), 15).size(), 255u);
}

TEST(SegmentTest, CreateOpenShareAndUnlink) {
  const std::string name = SegmentName("segtest" + std::to_string(getpid()), "g", 0);
  auto a = Segment::Create(name, 8192);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(Segment::Create(name, 8192).ok()) << "O_EXCL";
  auto b = Segment::Open(name, 8192);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(Segment::Open(name, 1 << 20).ok()) << "too small";
  static_cast<char*>((*a)->data())[100] = 42;
  EXPECT_EQ(static_cast<char*>((*b)->data())[100], 42);
  ASSERT_TRUE((*a)->Unlink().ok());
  EXPECT_NE(access(("/dev/shm" + name).c_str(), F_OK), 0);
  EXPECT_FALSE(Segment::Open(name, 8192).ok());
  static_cast<char*>((*b)->data())[7] = 9;  // mappings outlive the name
  EXPECT_EQ(static_cast<char*>((*a)->data())[7], 9);
  {
    const std::string other = SegmentName("segtest" + std::to_string(getpid()), "g", 1);
    auto c = Segment::Create(other, 4096);
    ASSERT_TRUE(c.ok());
  }  // destructor unlinks a still-linked segment
  EXPECT_NE(access(("/dev/shm" + SegmentName("segtest" + std::to_string(getpid()), "g", 1)).c_str(), F_OK), 0);
}

TEST(WaitTest, SeqReachedWraps) {
  EXPECT_TRUE(SeqReached(5, 5));
  EXPECT_TRUE(SeqReached(6, 5));
  EXPECT_FALSE(SeqReached(4, 5));
  EXPECT_TRUE(SeqReached(2, 0xfffffffeu));
  EXPECT_FALSE(SeqReached(0xfffffffeu, 2));
}

TEST(WaitTest, FutexWakeReleasesASleeper) {
  std::atomic<uint32_t> word{0}, waiters{0};
  WaitPolicy policy;
  policy.futex_slice = absl::Seconds(5);  // a missed wake would show as 5 s
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    PublishSeq(&word, &waiters, 1);
  });
  const absl::Time start = absl::Now();
  absl::Status s = WaitForSeq(&word, &waiters, 1, start + absl::Seconds(10), policy, nullptr,
                              [] { return absl::OkStatus(); });
  writer.join();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(waiters.load(), 0u);
}

TEST(WaitTest, DeadlineAndCheckEndTheWait) {
  std::atomic<uint32_t> word{0}, waiters{0};
  const absl::Time start = absl::Now();
  absl::Status s = WaitForSeq(&word, &waiters, 1, start + absl::Milliseconds(100),
                              WaitPolicy{}, nullptr, [] { return absl::OkStatus(); });
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  int calls = 0;
  s = WaitForSeq(&word, &waiters, 1, absl::Now() + absl::Seconds(10), WaitPolicy{}, nullptr, [&] {
    return ++calls == 3 ? absl::UnavailableError("peer died") : absl::OkStatus();
  });
  EXPECT_EQ(s.message(), "peer died");
}

// The race a 16-rank run hit: the phase completes (the last peer arrives,
// another leaves and exits) while this rank sits between reading the word
// and checking peer health. The completed wait must win over the failed
// check: the dead peer had already published.
TEST(WaitTest, CompletionDuringAFailedCheckWins) {
  std::atomic<uint32_t> word{0}, waiters{0};
  WaitPolicy policy = ChooseWaitPolicy(16, 2);
  policy.yield_iters = 0;  // no spin, no yield: straight to futex
  policy.futex_slice = absl::Milliseconds(1);
  int calls = 0;
  absl::Status s = WaitForSeq(&word, &waiters, 1, absl::Now() + absl::Seconds(10), policy, nullptr, [&] {
    ++calls;
    word.store(1, std::memory_order_release);  // the phase completed meanwhile
    return absl::UnavailableError("peer rank 2 (pid 1) died");
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 1);
  // Not completed: the failure stands.
  std::atomic<uint32_t> other{0};
  s = WaitForSeq(&other, &waiters, 1, absl::Now() + absl::Seconds(10), policy, nullptr,
                 [] { return absl::UnavailableError("peer rank 2 (pid 1) died"); });
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
}

// The choice is a pure function of (ranks, cores): a bounded adaptive yield
// stage always; a short spin only when every rank has a core of its own.
TEST(WaitPolicyTest, SpinsOnlyWhenEveryRankHasACore) {
  for (int cores : {1, 2, 8, 64}) {
    for (int ranks : {1, 2, 3, 8, 16, 64}) {
      const WaitPolicy p = ChooseWaitPolicy(ranks, cores);
      EXPECT_GT(p.yield_iters, 0) << ranks << " ranks on " << cores << " cores";
      EXPECT_LE(p.yield_iters, 1024) << "a bounded yield stage";
      EXPECT_TRUE(p.adaptive_yield) << "plain yields collapse next to a busy load";
      EXPECT_GE(p.futex_slice, absl::Milliseconds(1));
      EXPECT_LE(p.futex_slice, absl::Milliseconds(50));
      if (ranks > cores) {
        EXPECT_EQ(p.spin_iters, 0) << ranks << " ranks on " << cores << " cores";
      } else {
        EXPECT_GT(p.spin_iters, 0) << ranks << " ranks on " << cores << " cores";
        EXPECT_LE(p.spin_iters, 4096) << "a bounded spin";
      }
    }
  }
  EXPECT_GE(UsableCores(), 1);
}

// Oversubscribed: few big slots (fewer barrier phases per op); otherwise the
// cache-sized default. Always a valid layout (>= 2 slots, >= 64 B per rank).
TEST(WaitPolicyTest, SlotGeometryFollowsOversubscription) {
  for (int cores : {1, 2, 8}) {
    for (int ranks : {1, 2, 4, 16, 64}) {
      const SlotGeometry g = ChooseSlotGeometry(ranks, cores);
      EXPECT_GE(g.num_slots, 2);
      EXPECT_GE(g.slot_bytes, 64 * ranks);
      const SlotGeometry fit = ChooseSlotGeometry(1, 1);
      if (ranks > cores) {
        EXPECT_GT(g.slot_bytes, fit.slot_bytes) << ranks << " ranks on " << cores;
      } else {
        EXPECT_EQ(g.slot_bytes, fit.slot_bytes);
        EXPECT_EQ(g.num_slots, fit.num_slots);
      }
    }
  }
}

// After the spin and yield stages the first check comes only after a sleep:
// a wait released by its first wake never pays for one.
TEST(WaitTest, NoCheckWhenTheFirstWakeReleases) {
  std::atomic<uint32_t> word{0}, waiters{0};
  WaitPolicy policy = ChooseWaitPolicy(16, 2);
  policy.futex_slice = absl::Seconds(5);
  YieldGate gate;
  int calls = 0;
  std::thread writer([&] {
    while (waiters.load() == 0) std::this_thread::yield();
    PublishSeq(&word, &waiters, 1);
  });
  absl::Status s = WaitForSeq(&word, &waiters, 1, absl::Now() + absl::Seconds(10), policy, &gate,
                              [&] { ++calls; return absl::OkStatus(); });
  writer.join();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 0);
}


// placement.h: a move needs phases_to_move co-located phases in a row, and
// then at most one per min_interval_ns.
TEST(PlacementTest, ShouldMoveAfterAStreakAndRateLimited) {
  ColocationTracker t;
  t.phases_to_move = 3;
  t.min_interval_ns = 1000;
  EXPECT_FALSE(ShouldMove(t, true, 0));
  EXPECT_FALSE(ShouldMove(t, false, 0));  // the streak restarts
  EXPECT_FALSE(ShouldMove(t, true, 0));
  EXPECT_FALSE(ShouldMove(t, true, 0));
  EXPECT_TRUE(ShouldMove(t, true, 0));
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(ShouldMove(t, true, 500)) << i;  // too soon
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(ShouldMove(t, true, 2000)) << i;
  EXPECT_TRUE(ShouldMove(t, true, 2000));
}

// The thread lands on a CPU outside busy_cpus, and its mask is given back.
TEST(PlacementTest, MoveToFreeCpuRestoresTheMask) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  std::thread t([&] {
    std::vector<int> busy;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &before)) busy.push_back(c);
    }
    EXPECT_FALSE(MoveToFreeCpu(busy)) << "every CPU busy: nowhere to go";
    if (CPU_COUNT(&before) >= 2) {
      const int here = sched_getcpu();
      EXPECT_TRUE(MoveToFreeCpu({here}));
    }
    cpu_set_t after;
    ASSERT_EQ(sched_getaffinity(0, sizeof(after), &after), 0);
    EXPECT_TRUE(CPU_EQUAL(&before, &after));
  });
  t.join();
}
}  // namespace
}  // namespace tpudist::collectives::shm
