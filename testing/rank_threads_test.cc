#include "testing/rank_threads.h"

#include <atomic>
#include <string>
#include <stdexcept>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace tpudist::test_support {
namespace {

TEST(RankThreadsTest, EveryRankRunsOnItsOwnThreadAndIsJoined) {
  constexpr int kWorld = 5;
  std::vector<std::thread::id> ids(kWorld);
  std::atomic<int> arrived{0};
  const std::vector<RankError> errors = RunRankThreads(kWorld, [&](int rank) {
    ids[rank] = std::this_thread::get_id();
    // A barrier: passes only if all ranks run concurrently.
    ++arrived;
    while (arrived.load() < kWorld) std::this_thread::yield();
  });
  EXPECT_TRUE(errors.empty());
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_NE(ids[r], std::thread::id());
    EXPECT_NE(ids[r], std::this_thread::get_id());
    for (int q = r + 1; q < kWorld; ++q) EXPECT_NE(ids[r], ids[q]);
  }
}

// A thrown exception becomes a gtest failure naming the rank, and comes back.
TEST(RankThreadsTest, ExceptionsAreCollectedWithRankNumbers) {
  std::vector<RankError> errors;
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &failures);
    errors = RunRankThreads(4, [](int rank) {
      if (rank == 1 || rank == 3) throw std::runtime_error("boom " + std::to_string(rank));
    });
  }
  ASSERT_EQ(failures.size(), 2);
  std::vector<std::string> messages = {failures.GetTestPartResult(0).message(),
                                       failures.GetTestPartResult(1).message()};
  EXPECT_THAT(messages, ::testing::UnorderedElementsAre(::testing::HasSubstr("rank 1 threw: boom 1"),
                                                        ::testing::HasSubstr("rank 3 threw: boom 3")));
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0].rank, 1);
  EXPECT_EQ(errors[0].message, "boom 1");
  EXPECT_EQ(errors[1].rank, 3);
  EXPECT_EQ(errors[1].message, "boom 3");
}

// A rank that never returns aborts the process, naming it, instead of hanging.
TEST(RankThreadsDeathTest, HangAbortsNamingTheRank) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(RunRankThreads(
                   3,
                   [](int rank) {
                     if (rank == 2) {
                       for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
                     }
                   },
                   absl::Milliseconds(200)),
               "rank\\(s\\) 2 of 3 still running after 200ms: hang");
}

}  // namespace
}  // namespace tpudist::test_support
