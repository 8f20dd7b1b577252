// OpWorker: FIFO execution and destruction from its own thread (the last
// reference to a group dropped by an op's closure, e.g. a future callback
// holding the group through an autograd graph). CallbackThreads, and Work
// futures completing on them: a callback may issue an op and wait for it.
#include "collectives/op_worker.h"

#include <ATen/ATen.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectives/callback_threads.h"
#include "collectives/process_group_tpu_dist.h"
#include "testing/collectives_util.h"
#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

using Clock = std::chrono::steady_clock;

// Waits (bounded) until `done` holds.
template <typename Pred>
bool WaitFor(Pred done, std::chrono::seconds limit = std::chrono::seconds(10)) {
  const auto until = Clock::now() + limit;
  while (!done() && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return done();
}

TEST(OpWorkerTest, RunsOpsInOrder) {
  std::vector<int> seen;
  std::atomic<int> n{0};
  {
    OpWorker w;
    for (int i = 0; i < 5; ++i) {
      w.Enqueue([&, i] {
        seen.push_back(i);
        ++n;
      });
    }
  }  // drains, then joins
  EXPECT_EQ(n.load(), 5);
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(OpWorkerTest, ThreadIsNamedAndWakesForOpsEnqueuedWhileAnInlineOpRuns) {
  OpWorker w("tpud-test-name-too-long");
  std::string name;
  std::atomic<bool> ran{false};
  // An inline op holds the worker busy while another op is queued: the end
  // of the inline op must wake the (cv-sleeping, non-polling) worker.
  ASSERT_TRUE(w.RunInlineIfIdle([&] {
    w.Enqueue([&] {
      char buf[32] = {};
      pthread_getname_np(pthread_self(), buf, sizeof(buf));
      name = buf;
      ran = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(ran.load());  // FIFO: not before the inline op ends
  }));
  ASSERT_TRUE(WaitFor([&] { return ran.load(); }, std::chrono::seconds(2)));
  EXPECT_EQ(name, "tpud-test-name-");  // truncated to 15 characters
}

TEST(OpWorkerTest, ThenRunsOnceTheWorkerIsIdle) {
  // `then` completes an op's Work; whoever it wakes must find the worker
  // idle, or its next small op queues behind the worker's bookkeeping.
  OpWorker w;
  std::atomic<bool> then_ran{false}, inline_ran{false}, inline_accepted{false};
  w.Enqueue([] {}, [&] {
    inline_accepted = w.RunInlineIfIdle([&] { inline_ran = true; });
    then_ran = true;
  });
  ASSERT_TRUE(WaitFor([&] { return then_ran.load(); }, std::chrono::seconds(2)));
  EXPECT_TRUE(inline_accepted.load());
  EXPECT_TRUE(inline_ran.load());
  // Inline ops run their `then` too, after the op.
  std::vector<int> order;
  ASSERT_TRUE(w.RunInlineIfIdle([&] { order.push_back(1); }, [&] { order.push_back(2); }));
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

// BeginInline/EndInline (the process group's inline path): refused while an
// op runs or is queued, and while the caller holds the worker, a queued op
// waits for EndInline; ops_done counts the inline op.
TEST(OpWorkerTest, BeginInlineOnlyWhenIdleAndHoldsTheWorkerUntilEndInline) {
  OpWorker w;
  std::atomic<bool> release{false}, queued_ran{false};
  w.Enqueue([&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  EXPECT_FALSE(w.BeginInline());  // an op queued or running
  release = true;
  ASSERT_TRUE(WaitFor([&] { return w.ops_done() == 1; }, std::chrono::seconds(2)));
  bool held = false;  // (WaitFor asks once more after success: remember it)
  ASSERT_TRUE(WaitFor([&] { return held || (held = w.BeginInline()); }, std::chrono::seconds(2)));
  EXPECT_FALSE(w.BeginInline());  // the caller holds it
  w.Enqueue([&] { queued_ran = true; });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(queued_ran.load());  // FIFO: behind the inline op
  w.EndInline();
  ASSERT_TRUE(WaitFor([&] { return queued_ran.load(); }, std::chrono::seconds(2)));
  EXPECT_EQ(w.ops_done(), 3);
}

TEST(OpWorkerTest, DestroyedByItsOwnOpDoesNotDeadlockOrAbort) {
  // The only owner of the worker is the closure of an op queued on it, so
  // the worker is destroyed on its own thread when that closure is dropped.
  auto owner = std::make_shared<std::unique_ptr<OpWorker>>(std::make_unique<OpWorker>());
  auto token = std::make_shared<int>(0);
  std::weak_ptr<int> alive = token;
  std::atomic<bool> ran{false};
  OpWorker* raw = owner->get();
  raw->Enqueue([owner, token, &ran] { ran = true; });
  owner.reset();
  token.reset();
  // Before the fix: std::system_error "Resource deadlock avoided" -> abort.
  EXPECT_TRUE(WaitFor([&] { return alive.expired(); }));
  EXPECT_TRUE(ran.load());
}

TEST(OpWorkerTest, GroupReleasedFromAFutureCallbackOnTheWorkerThread) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = test_support::UniqueJob("selfdrop");
  c10::weak_intrusive_ptr<ProcessGroupTpuDist> weak(
      c10::intrusive_ptr<ProcessGroupTpuDist>{});
  std::atomic<bool> issued{false}, callback_ran{false};
  test_support::RunRankThreads(2, [&](int rank) {
    auto opts = test_support::SmallOptions(job);
    opts.inline_max_bytes = -1;  // always on the worker thread
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, opts);
    std::vector<at::Tensor> t = {at::ones({64}, at::kFloat)};
    if (rank == 0) {
      auto work = pg->allreduce(t);
      // The callback owns the group; it is the last owner once we drop ours.
      work->getFuture()->addCallback([pg, &callback_ran](c10::ivalue::Future&) {
        callback_ran = true;
      });
      weak = c10::weak_intrusive_ptr<ProcessGroupTpuDist>(pg);
      pg.reset();
      work.reset();
      issued = true;
      EXPECT_TRUE(WaitFor([&] { return weak.expired(); }));
    } else {
      ASSERT_TRUE(WaitFor([&] { return issued.load(); }));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      pg->allreduce(t)->wait();
      EXPECT_TRUE(at::equal(t[0], at::full({64}, 2.0f)));
    }
  });
  EXPECT_TRUE(callback_ran.load());
}

TEST(OpWorkerTest, StopRunsWhatIsQueuedThenLaterOpsRunOnTheCaller) {
  // Stop() lets a group's thread leave while the group lives on (c10d's
  // shutdown(), Python's exit hook): ops queued before it still run, on the
  // worker; ops enqueued once it has left run on the caller, in order.
  OpWorker w;
  std::atomic<int> on_worker{0};
  const std::thread::id caller = std::this_thread::get_id();
  for (int i = 0; i < 3; ++i) {
    w.Enqueue([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (std::this_thread::get_id() != caller) ++on_worker;
    });
  }
  ASSERT_TRUE(w.Stop(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(on_worker.load(), 3);
  EXPECT_EQ(w.ops_done(), 3);
  EXPECT_TRUE(w.Stop(absl::Now()));  // idempotent
  std::vector<int> order;
  w.Enqueue([&] { order.push_back(1); }, [&] { order.push_back(2); });
  EXPECT_EQ(order, (std::vector<int>{1, 2}));  // ran before Enqueue returned
  EXPECT_FALSE(w.RunInlineIfIdle([] {}));
  EXPECT_EQ(w.ops_done(), 4);
}

TEST(OpWorkerTest, StopWaitsNoLongerThanItsDeadline) {
  OpWorker w;
  std::atomic<bool> release{false};
  w.Enqueue([&] { WaitFor([&] { return release.load(); }); });
  const auto t0 = Clock::now();
  EXPECT_FALSE(w.Stop(absl::Now() + absl::Milliseconds(100)));  // the op is still running
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  release = true;
  EXPECT_TRUE(w.Stop(absl::Now() + absl::Seconds(10)));
}

// The names of this process's threads (/proc/self/task/*/comm).
std::vector<std::string> ThreadNames() {
  std::vector<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) names.push_back(name);
  }
  return names;
}

// Slows the exit of the thread that made it: a thread still leaving after
// its loop returned (thread-local destructors run last).
struct SlowThreadExit {
  ~SlowThreadExit() { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }
};

// Stop() returning true means the thread is gone: destroy_process_group and
// then a look at /proc/self/task (test_future_callbacks.py,
// test_group_lifecycle.py) saw "tpud-p2p" still leaving, 2 runs in 12.
TEST(OpWorkerTest, StopReturnsOnlyOnceTheThreadHasExited) {
  OpWorker w("tpud-stop-exit");
  w.Enqueue([] {
    static thread_local SlowThreadExit slow;
    (void)&slow;
  });
  ASSERT_TRUE(w.Stop(absl::Now() + absl::Seconds(10)));
  const std::vector<std::string> names = ThreadNames();
  EXPECT_EQ(std::count(names.begin(), names.end(), "tpud-stop-exit"), 0);
}

TEST(OpWorkerTest, GroupStopThreadsEndsWithItsOpInFlight) {
  // c10d's shutdown() on a group whose op waits for a peer that never comes:
  // the op ends at its deadline, the threads leave, the Work has failed.
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = test_support::UniqueJob("stopthreads");
  test_support::RunRankThreads(2, [&](int rank) {
    auto opts = test_support::SmallOptions(job);
    opts.inline_max_bytes = -1;  // on the worker thread
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, opts);
    if (rank != 0) return;  // never joins the all_reduce
    std::vector<at::Tensor> t = {at::ones({64}, at::kFloat)};
    c10d::AllreduceOptions ar;
    ar.timeout = std::chrono::milliseconds(500);
    auto work = pg->allreduce(t, ar);
    const auto t0 = Clock::now();
    EXPECT_TRUE(pg->StopThreads());
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
    EXPECT_TRUE(work->isCompleted());
    EXPECT_FALSE(work->isSuccess());
  });
}

TEST(CallbackThreadsTest, ABlockedTaskDoesNotHoldUpLaterOnes) {
  CallbackThreads cb("tpud-test-cb");
  std::atomic<bool> second_ran{false}, first_done{false};
  // The first task waits for the second (a callback waiting on a nested
  // op's future, whose completion is posted after it).
  cb.Post([&] {
    WaitFor([&] { return second_ran.load(); });
    first_done = second_ran.load();
  });
  cb.Post([&] { second_ran = true; });
  EXPECT_TRUE(WaitFor([&] { return first_done.load(); }, std::chrono::seconds(5)));
  EXPECT_EQ(cb.threads(), 2);
  // Idle threads are reused: no third thread for one more task.
  std::atomic<bool> third{false};
  cb.Post([&] { third = true; });
  EXPECT_TRUE(WaitFor([&] { return third.load(); }, std::chrono::seconds(5)));
  EXPECT_EQ(cb.threads(), 2);
}

TEST(CallbackThreadsTest, TasksStartInOrderSurviveExceptionsAndRunInlineAfterStop) {
  CallbackThreads cb("tpud-test-callbacks");
  std::mutex mu;
  std::vector<int> started;
  std::string name;
  EXPECT_FALSE(cb.OnCallbackThread());
  for (int i = 0; i < 20; ++i) {
    cb.Post([&, i] {
      {
        std::lock_guard<std::mutex> lock(mu);
        started.push_back(i);
      }
      if (i == 3) throw std::runtime_error("callback boom");
      if (i == 4) throw 42;  // not a std::exception either
    });
  }
  std::atomic<bool> on_cb{false};
  cb.Post([&] {
    char buf[32] = {};
    pthread_getname_np(pthread_self(), buf, sizeof(buf));
    std::lock_guard<std::mutex> lock(mu);
    name = buf;
    on_cb = cb.OnCallbackThread();
  });
  ASSERT_TRUE(cb.Stop(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(cb.threads(), 0);
  std::vector<int> want(20);
  for (int i = 0; i < 20; ++i) want[i] = i;
  // Several threads may run them, but each starts after the one before.
  std::vector<int> sorted = started;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, want);
  EXPECT_EQ(name, "tpud-test-callb");
  EXPECT_TRUE(on_cb.load());
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  cb.Post([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, caller);
}

TEST(CallbackThreadsTest, StopFromACallbackOnlyAsksAndDestructionWaits) {
  auto cb = std::make_unique<CallbackThreads>("tpud-test-cb");
  std::atomic<int> stop_result{-1};
  std::atomic<bool> later{false};
  cb->Post([&] { stop_result = cb->Stop(absl::InfiniteFuture()) ? 1 : 0; });
  ASSERT_TRUE(WaitFor([&] { return stop_result.load() >= 0; }));
  EXPECT_EQ(stop_result.load(), 0);  // returned at once, did not wait for itself
  cb->Post([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    later = true;
  });
  cb.reset();  // runs what was posted, then joins
  EXPECT_TRUE(later.load());
}

// A rank's c10d options for an async op.
c10d::AllreduceOptions Async() {
  c10d::AllreduceOptions o;
  o.asyncOp = true;
  return o;
}

TEST(OpWorkerTest, CollectiveIssuedAndWaitedForInAFutureCallbackCompletes) {
  // Issue 38: DDP's PowerSGD hook. The callback used to run on the op
  // thread, where the nested op queued behind the op completing it: a
  // deadlock that no deadline ended. Both sizes: inline-eligible and not.
  for (const int64_t n : {int64_t{4}, int64_t{1} << 18}) {
    auto store = c10::make_intrusive<c10d::HashStore>();
    const std::string job = test_support::UniqueJob("nested");
    test_support::RunRankThreads(2, [&](int rank) {
      auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2,
                                                         test_support::SmallOptions(job));
      std::vector<at::Tensor> outer = {at::full({n}, float(rank + 1))};
      std::atomic<bool> nested_done{false};
      auto child = pg->allreduce(outer, Async())->getFuture()->then(
          [pg, n, &nested_done](c10::ivalue::Future&) -> c10::IValue {
            std::vector<at::Tensor> inner = {at::ones({n}, at::kFloat)};
            auto fut = pg->allreduce(inner, Async())->getFuture();
            nested_done = WaitFor([&] { return fut->completed(); });  // bounded
            return c10::IValue(inner[0]);
          },
          c10::TensorType::get());
      ASSERT_TRUE(WaitFor([&] { return child->completed(); }, std::chrono::seconds(30)));
      EXPECT_TRUE(nested_done.load());
      ASSERT_FALSE(child->hasError()) << child->tryRetrieveErrorMessage();
      EXPECT_TRUE(at::equal(child->value().toTensor(), at::full({n}, 2.0f)));
      EXPECT_TRUE(at::equal(outer[0], at::full({n}, 3.0f)));
    });
  }
}

TEST(OpWorkerTest, ACallbackThatThrowsFailsTheWorkAndTheGroupGoesOn) {
  // Before: the exception escaped markCompleted on the op thread ->
  // std::terminate. Now it fails the Work (as Gloo does), and only that.
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = test_support::UniqueJob("throwing");
  std::atomic<bool> added{false};
  test_support::RunRankThreads(2, [&](int rank) {
    auto opts = test_support::SmallOptions(job);
    opts.inline_max_bytes = -1;  // on the op thread
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, opts);
    std::vector<at::Tensor> t = {at::ones({8}, at::kFloat)};
    if (rank == 0) {
      auto work = pg->allreduce(t, Async());
      work->getFuture()->addCallback(
          [](c10::ivalue::Future&) { throw std::runtime_error("callback boom"); });
      added = true;
      EXPECT_NE(test_support::ErrorOf(work).find("callback boom"),
                std::string::npos);
      EXPECT_TRUE(work->getFuture()->completed());
      EXPECT_FALSE(work->getFuture()->hasError());  // the op itself succeeded
    } else {
      ASSERT_TRUE(WaitFor([&] { return added.load(); }));
      pg->allreduce(t, Async())->wait();
    }
    EXPECT_TRUE(at::equal(t[0], at::full({8}, 2.0f)));
    std::vector<at::Tensor> u = {at::full({8}, float(rank))};
    pg->allreduce(u, Async())->wait();  // the op thread lives on
    EXPECT_TRUE(at::equal(u[0], at::full({8}, 1.0f)));
  });
}

}  // namespace
}  // namespace tpudist::collectives
