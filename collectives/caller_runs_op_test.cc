// Ops that run on the thread that waits for them instead of the group's
// worker thread (issue 36 item 2): a collective issued with asyncOp == false
// runs inline on the caller when the queue is idle, at any size, and a
// wait() on a queued op that is next in an idle queue runs it on the waiter
// (OpWorker::QueuedOp::RunHere). Checked: issue order across ranks when
// inline, waited-on and worker-run ops mix; one op at a time; the op's own
// deadline when a peer never joins; abort() from another thread; and that
// the fast paths are taken at all; that an inline op's Work, complete
// before it is returned, keeps the Work contract; and that an inline op
// blocked on a late peer is already in the flight recorder (its
// bookkeeping runs while it waits).
#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/op_worker.h"
#include "collectives/process_group_tpu_dist.h"
#include "testing/collectives_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

using ::testing::HasSubstr;
using test_support::ErrorOf;
using test_support::RunRankThreads;
using test_support::SecondsSince;
using test_support::SmallOptions;
using test_support::UniqueJob;
using Clock = std::chrono::steady_clock;

// SmallOptions with the inline limit at its default (every size).
ProcessGroupTpuDist::Options DefaultInlineOptions(const std::string& job) {
  ProcessGroupTpuDist::Options o = SmallOptions(job);
  o.inline_max_bytes = ProcessGroupTpuDist::Options().inline_max_bytes;
  return o;
}

TEST(CallerRunsOpTest, RunHereRunsNothingBehindARunningOp) {
  OpWorker w;
  std::atomic<bool> release{false}, a_started{false}, b_ran{false};
  std::atomic<int> running{0}, overlap{0};
  w.Enqueue([&] {
    if (running.fetch_add(1) != 0) ++overlap;
    a_started = true;
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    running.fetch_sub(1);
  });
  while (!a_started.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  OpWorker::QueuedOp b = w.Enqueue([&] {
    if (running.fetch_add(1) != 0) ++overlap;
    b_ran = true;
    running.fetch_sub(1);
  });
  // A runs on the worker: B must neither run beside it nor before it.
  EXPECT_FALSE(b.RunHere());
  EXPECT_FALSE(b_ran.load());
  release = true;
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (!b_ran.load() && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(b_ran.load());
  EXPECT_FALSE(b.RunHere());  // taken by the worker: nothing left to run
  EXPECT_EQ(overlap.load(), 0);
  EXPECT_FALSE(OpWorker::QueuedOp().RunHere());
}

// Ops enqueued one to three at a time, the last of each batch offered to
// RunHere at once: every op runs once, in enqueue order, one at a time, and
// the caller does get to run some (the worker needs a wake-up first).
TEST(CallerRunsOpTest, RunHereKeepsOrderAndIsTaken) {
  constexpr int kBatches = 300;
  std::vector<int> order;  // written by whichever thread runs the op, one at a time
  order.reserve(3 * kBatches);
  std::atomic<int> running{0}, overlap{0}, on_caller{0}, ran_here{0};
  int next = 0;
  {
    OpWorker w;
    const std::thread::id caller = std::this_thread::get_id();
    for (int b = 0; b < kBatches; ++b) {
      OpWorker::QueuedOp last;
      std::atomic<bool> last_done{false};
      const int n = 1 + b % 3;
      for (int i = 0; i < n; ++i) {
        const int id = next++;
        const bool is_last = i == n - 1;
        last = w.Enqueue(
            [&, id] {
              if (running.fetch_add(1) != 0) ++overlap;
              order.push_back(id);
              if (std::this_thread::get_id() == caller) ++on_caller;
              running.fetch_sub(1);
            },
            [&, is_last] {
              if (is_last) last_done = true;
            });
      }
      if (last.RunHere()) {
        ++ran_here;
        EXPECT_TRUE(last_done.load());  // its `then` ran too, before returning
      }
      const auto until = Clock::now() + std::chrono::seconds(10);
      while (!last_done.load() && Clock::now() < until) std::this_thread::yield();
      ASSERT_TRUE(last_done.load());
    }
  }
  ASSERT_EQ(static_cast<int>(order.size()), next);
  for (int i = 0; i < next; ++i) ASSERT_EQ(order[i], i) << "op " << i << " out of order";
  EXPECT_EQ(overlap.load(), 0);
  EXPECT_EQ(on_caller.load(), ran_here.load());
  std::printf("[measure] RunHere ran %d of %d waited-on ops on the caller\n", ran_here.load(),
              kBatches);
  EXPECT_GT(ran_here.load(), 0);
}

// Two ranks issue the same ops -- asyncOp true and false, 8 B to 1 MiB --
// and wait for them in different orders (rank 0 last-issued first, rank 1
// in issue order), so some run inline, some on a waiter, some on the
// worker. Every result must be the sum of the two ranks' inputs for that
// very op: an op run out of issue order on one rank meets a different op on
// the other (a mismatch error or a wrong sum).
TEST(CallerRunsOpTest, InlineWaitedAndQueuedOpsKeepIssueOrder) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("cro");
  const std::vector<int64_t> kNumel = {2, 16 << 10, 256 << 10};  // 8 B, 64 KiB, 1 MiB fp32
  RunRankThreads(2, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, DefaultInlineOptions(job));
    for (int round = 0; round < 4; ++round) {
      std::vector<std::vector<at::Tensor>> bufs;
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      std::vector<float> expect;
      for (int i = 0; i < 9; ++i) {
        const float mine = 100.0f * round + 10.0f * i + rank;  // per op and rank
        bufs.push_back({at::full({kNumel[i % 3]}, mine, at::kFloat)});
        expect.push_back(2 * (100.0f * round + 10.0f * i) + 1);
        c10d::AllreduceOptions o;
        o.asyncOp = (i + round) % 2 == 0;
        works.push_back(pg->allreduce(bufs.back(), o));
        if (!o.asyncOp) {
          EXPECT_EQ(ErrorOf(works.back()), "");
        }
      }
      for (int k = 0; k < 9; ++k) {
        const int i = rank == 0 ? 8 - k : k;
        EXPECT_EQ(ErrorOf(works[i]), "") << "op " << i;
        EXPECT_TRUE(at::equal(bufs[i][0], at::full({kNumel[i % 3]}, expect[i], at::kFloat)))
            << "op " << i << " round " << round;
      }
    }
  });
}

// A 1 MiB op waited on at once runs inline (its Work is complete when the
// call returns) and still ends at its own deadline when the peer never
// joins; an async op that the waiter runs (RunHere) likewise.
TEST(CallerRunsOpTest, AnOpRunByItsWaiterEndsAtItsDeadlineWhenAPeerNeverJoins) {
  for (const bool async : {false, true}) {
    auto store = c10::make_intrusive<c10d::HashStore>();
    const std::string job = UniqueJob(async ? "crd1" : "crd0");
    std::atomic<bool> done{false};
    RunRankThreads(2, [&](int rank) {
      ProcessGroupTpuDist::Options o = DefaultInlineOptions(job);
      o.timeout = std::chrono::seconds(2);
      auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, o);
      if (rank == 1) {  // constructs the group, never joins the op
        while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return;
      }
      std::vector<at::Tensor> t = {at::ones({256 << 10}, at::kFloat)};  // [262144], 1 MiB
      c10d::AllreduceOptions opts;
      opts.asyncOp = async;
      const auto start = Clock::now();
      auto work = pg->allreduce(t, opts);
      if (!async) {
        EXPECT_TRUE(work->isCompleted()) << "a waited-on 1 MiB op did not run inline";
      }
      const std::string err = ErrorOf(work, std::chrono::seconds(30));
      const double took = SecondsSince(start);
      std::printf("[measure] %s op ended %.2f s after it started (timeout 2 s)\n",
                  async ? "async" : "inline", took);
      EXPECT_THAT(err, HasSubstr("DEADLINE_EXCEEDED"));
      EXPECT_GT(took, 1.5);
      EXPECT_LT(took, 10.0);
      done = true;
    });
  }
}

// abort() from another thread ends an op running on its caller (inline) or
// on its waiter within milliseconds, not at its 60 s timeout.
TEST(CallerRunsOpTest, AbortFromAnotherThreadEndsAnOpRunByItsCaller) {
  for (const bool async : {false, true}) {
    auto store = c10::make_intrusive<c10d::HashStore>();
    const std::string job = UniqueJob(async ? "cra1" : "cra0");
    std::atomic<bool> done{false};
    RunRankThreads(2, [&](int rank) {
      ProcessGroupTpuDist::Options o = DefaultInlineOptions(job);
      o.timeout = std::chrono::seconds(60);
      auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, o);
      if (rank == 1) {
        while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return;
      }
      std::thread aborter([pg] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        pg->abort();
      });
      std::vector<at::Tensor> t = {at::ones({256 << 10}, at::kFloat)};  // [262144], 1 MiB
      c10d::AllreduceOptions opts;
      opts.asyncOp = async;
      const auto start = Clock::now();
      auto work = pg->allreduce(t, opts);
      const std::string err = ErrorOf(work, std::chrono::seconds(90));
      const double took = SecondsSince(start);
      aborter.join();
      std::printf("[measure] %s op ended %.3f s after it started (abort at 0.3 s)\n",
                  async ? "async" : "inline", took);
      EXPECT_THAT(err, HasSubstr("abort() called"));
      EXPECT_LT(took, 5.0);
      done = true;
    });
  }
}

// A Work whose op ran inline is complete before it is returned (it never
// locks or wakes): it must still keep c10d's whole Work contract, on success
// and on failure: state, wait(), result(), a future made afterwards and its
// callbacks.
TEST(CallerRunsOpTest, AnInlineOpsWorkKeepsTheWorkContract) {
  {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(
        c10::make_intrusive<c10d::HashStore>(), 0, 1, DefaultInlineOptions(UniqueJob("crw")));
    std::vector<at::Tensor> t = {at::full({3}, 2.0f)};  // [3]
    c10d::AllreduceOptions opts;
    opts.asyncOp = false;
    auto work = pg->allreduce(t, opts);
    EXPECT_TRUE(work->isCompleted());
    EXPECT_TRUE(work->isSuccess());
    EXPECT_TRUE(work->wait());
    ASSERT_EQ(work->result().size(), 1u);
    EXPECT_TRUE(work->result()[0].is_same(t[0]));
    auto future = work->getFuture();
    ASSERT_TRUE(future->completed());
    EXPECT_FALSE(future->hasError());
    EXPECT_TRUE(future->value().toTensorVector()[0].is_same(t[0]));
    std::atomic<bool> ran{false};
    future->addCallback([&](c10::ivalue::Future& f) { ran = !f.hasError(); });
    EXPECT_TRUE(ran.load());
    EXPECT_EQ(work->getFuture().get(), future.get());
    pg->shutdown();
  }
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("crf");
  std::atomic<bool> done{false};
  RunRankThreads(2, [&](int rank) {
    ProcessGroupTpuDist::Options o = DefaultInlineOptions(job);
    o.timeout = std::chrono::seconds(1);
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, o);
    if (rank == 1) {  // never joins the op
      while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    std::vector<at::Tensor> t = {at::ones({4})};  // [4]
    c10d::AllreduceOptions opts;
    opts.asyncOp = false;
    auto work = pg->allreduce(t, opts);
    EXPECT_TRUE(work->isCompleted()) << "a waited-on op did not run inline";
    EXPECT_FALSE(work->isSuccess());
    EXPECT_TRUE(work->exception() != nullptr);
    EXPECT_THAT(ErrorOf(work, std::chrono::seconds(5)), HasSubstr("DEADLINE_EXCEEDED"));
    auto future = work->getFuture();
    ASSERT_TRUE(future->completed());
    ASSERT_TRUE(future->hasError());
    EXPECT_THAT(future->tryRetrieveErrorMessage(), HasSubstr("DEADLINE_EXCEEDED"));
    std::string seen;
    future->addCallback([&](c10::ivalue::Future& f) { seen = f.tryRetrieveErrorMessage(); });
    EXPECT_THAT(seen, HasSubstr("DEADLINE_EXCEEDED"));
    done = true;
  });
}


// An inline op makes its flight-recorder entry while it waits for a late
// peer (OpContext::while_waiting), not after the op: a hang must show the
// op that hangs. Rank 1 joins only once it has seen rank 0's entry as
// started (or after 10 s, failing). With the option off the entry is made
// before the op, which must show it too.
TEST(CallerRunsOpTest, AnInlineOpBlockedOnALatePeerIsInTheFlightRecorder) {
  for (const bool while_waiting : {true, false}) {
    SCOPED_TRACE(while_waiting ? "bookkeeping while waiting" : "bookkeeping before the op");
    auto store = c10::make_intrusive<c10d::HashStore>();
    const std::string job = UniqueJob(while_waiting ? "crfr1" : "crfr0");
    std::atomic<ProcessGroupTpuDist*> rank0{nullptr};
    RunRankThreads(2, [&](int rank) {
      ProcessGroupTpuDist::Options o = DefaultInlineOptions(job);
      o.bookkeeping_while_waiting = while_waiting;
      auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, o);
      std::vector<at::Tensor> t = {at::full({2}, static_cast<float>(rank + 1))};  // [2]
      c10d::AllreduceOptions opts;
      opts.asyncOp = false;
      if (rank == 1) {
        const auto start = Clock::now();
        while (rank0.load() == nullptr && SecondsSince(start) < 30.0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        ASSERT_NE(rank0.load(), nullptr) << "rank 0 made no group within 30 s";
        bool seen = false;
        while (!seen && SecondsSince(start) < 10.0) {
          for (const FlightRecorder::Entry& e : rank0.load()->flight_recorder()->Entries()) {
            seen = seen || (e.op.name == "all_reduce" &&
                            e.state == FlightRecorder::State::kStarted && !e.retired);
          }
          if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        EXPECT_TRUE(seen) << "rank 0's blocked all_reduce was not in its flight recorder";
      } else {
        rank0 = pg.get();
      }
      auto work = pg->allreduce(t, opts);
      EXPECT_TRUE(work->isCompleted());
      EXPECT_TRUE(work->isSuccess());
      EXPECT_EQ(t[0][0].item<float>(), 3.0f);
      const std::vector<FlightRecorder::Entry> entries = pg->flight_recorder()->Entries();
      ASSERT_FALSE(entries.empty());
      EXPECT_EQ(entries.back().op.name, "all_reduce");
      EXPECT_EQ(entries.back().state, FlightRecorder::State::kCompleted);
    });
  }
}

}  // namespace
}  // namespace tpudist::collectives
