// Aborting groups from outside the op (the job failed elsewhere):
// ProcessGroupTpuDist::Abort from another thread (what distributed::Job's
// error callback does for each group of the job) fails the op in flight
// within milliseconds instead of at its timeout, on one host (shm) and across
// two emulated hosts (shm + TCP), and poisons the group.
#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/process_group_tpu_dist.h"
#include "testing/collectives_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using test_support::ErrorOf;
using test_support::RunRankThreads;
using test_support::SecondsSince;
using test_support::ShmEntries;
using test_support::SmallOptions;
using test_support::UniqueJob;
using Clock = std::chrono::steady_clock;

// Rank `hung` never joins the allreduce; after 300 ms another thread aborts
// every group the test made, as the coordination client's error callback
// does for the job's groups. The op timeout is 60 s: only the abort can end
// the wait.
void ExpectAbortEndsTheWait(int world, const std::vector<std::string>& host_of_rank,
                            const std::string& job) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  constexpr int kHung = 1;
  std::atomic<int> constructed{0};
  std::atomic<bool> aborted{false};
  std::mutex mu;
  std::vector<c10::intrusive_ptr<ProcessGroupTpuDist>> groups;  // guarded by mu
  std::thread aborter([&] {
    while (constructed.load() < world) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(static_cast<int>(groups.size()), world);
      const absl::Status cause =
          absl::UnavailableError("job failed: task 1 missed its heartbeat deadline");
      for (const auto& group : groups) group->Abort(cause);
      groups.clear();
    }
    aborted.store(true);
  });
  RunRankThreads(world, [&](int rank) {
    auto o = SmallOptions(job);
    o.timeout = std::chrono::seconds(60);
    if (!host_of_rank.empty()) {
      o.host_id = host_of_rank[rank];
      o.bind_address = "127.0.0.1";
    }
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, world, o);
    {
      std::lock_guard<std::mutex> lock(mu);
      groups.push_back(pg);
    }
    constructed.fetch_add(1);
    std::vector<at::Tensor> t = {at::ones({1 << 16}, at::kFloat)};  // [65536]
    if (rank == kHung) {
      while (!aborted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      // Joining after the abort: fails at once, same cause.
      EXPECT_THAT(ErrorOf(pg->allreduce(t)), HasSubstr("missed its heartbeat"));
      return;
    }
    const auto start = Clock::now();
    const std::string err = ErrorOf(pg->allreduce(t));
    const double took = SecondsSince(start);
    std::printf("[measure] rank %d: allreduce ended %.3f s after it started (abort at ~0.3 s)\n",
                rank, took);
    EXPECT_LT(took, 5.0);
    if (host_of_rank.empty()) {
      EXPECT_THAT(err, HasSubstr("task 1 missed its heartbeat deadline"));
    } else {
      // Across hosts a peer's abort may close a TCP connection before this
      // rank's own abort lands: either cause ends the wait.
      EXPECT_THAT(err, ::testing::AnyOf(HasSubstr("task 1 missed its heartbeat deadline"),
                                        HasSubstr("closed the connection")));
    }
    EXPECT_FALSE(pg->status().ok());
    const auto again = Clock::now();
    EXPECT_THAT(ErrorOf(pg->barrier()), Not(::testing::IsEmpty()));
    EXPECT_LT(SecondsSince(again), 1.0);
  });
  aborter.join();
  EXPECT_THAT(ShmEntries("tpud_" + job), IsEmpty());
}

TEST(AbortTest, AbortEndsAnOpWaitingOnAHungRankOneHost) {
  ExpectAbortEndsTheWait(3, {}, UniqueJob("ab1"));
}

TEST(AbortTest, AbortEndsAnOpWaitingOnAHungRankTwoHosts) {
  ExpectAbortEndsTheWait(4, {"hA", "hA", "hB", "hB"}, UniqueJob("ab2"));
}

TEST(AbortTest, C10dAbortPoisonsTheGroup) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("ab3");
  RunRankThreads(2, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, SmallOptions(job));
    pg->abort();
    EXPECT_THAT(std::string(pg->status().message()), HasSubstr("abort() called"));
    std::vector<at::Tensor> t = {at::ones({4}, at::kFloat)};  // [4]
    EXPECT_THAT(ErrorOf(pg->allreduce(t)), HasSubstr("abort() called"));
  });
}

// torch's Backend::get_error: SUCCESS on a healthy group, COMM_ERROR after
// abort(), TIMEOUT after an op missed its deadline (Gloo always answers
// SUCCESS; torchft-style supervisors read this).
TEST(AbortTest, GetErrorClassifiesThePoison) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("ab4");
  RunRankThreads(2, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, SmallOptions(job));
    EXPECT_EQ(pg->getError(), c10d::ErrorType::SUCCESS);
    std::vector<at::Tensor> t = {at::ones({4}, at::kFloat)};  // [4]
    if (rank == 0) {
      c10d::AllreduceOptions o;
      o.timeout = std::chrono::milliseconds(200);  // rank 1 never joins
      EXPECT_THAT(ErrorOf(pg->allreduce(t, o)), HasSubstr("deadline"));
      EXPECT_EQ(pg->getError(), c10d::ErrorType::TIMEOUT);
    }
    store->add("ab4_timed_out", 1);
    store->wait({"ab4_timed_out"});
    auto fresh = c10::make_intrusive<ProcessGroupTpuDist>(
        c10::make_intrusive<c10d::PrefixStore>("second", store), rank, 2, SmallOptions(job));
    fresh->abort();
    EXPECT_EQ(fresh->getError(), c10d::ErrorType::COMM_ERROR);
  });
}

}  // namespace
}  // namespace tpudist::collectives
