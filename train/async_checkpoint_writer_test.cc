// AsyncCheckpointWriter's agreement, with ranks as threads over an
// in-process c10d::HashStore: rank 0 commits only after every rank's part
// is written; one failed part means no commit and an error on every rank; a
// rank that never posts is DeadlineExceeded on rank 0 naming its key; at
// most one save in flight, and the next sequence is independent.
#include "train/async_checkpoint_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace tpudist::train {
namespace {

using ::testing::HasSubstr;

AsyncCheckpointWriterOptions Opts(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
                                  absl::Duration timeout = absl::Seconds(20)) {
  return AsyncCheckpointWriterOptions{store, rank, world, "test", timeout};
}

class AsyncCheckpointWriterTest : public ::testing::TestWithParam<int> {};

TEST_P(AsyncCheckpointWriterTest, CommitsOnlyAfterEveryPartAndEveryRankLearnsThePath) {
  const int world = GetParam();
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::atomic<int> written{0};
  std::atomic<int> written_at_commit{-1};
  std::vector<absl::StatusOr<std::string>> out(world, std::string("unset"));
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      AsyncCheckpointWriter w(Opts(store, r, world));
      for (int64_t seq = 0; seq < 2; ++seq) {
        w.Start(
            seq,
            [&, r] {
              absl::SleepFor(absl::Milliseconds(20 * r));  // rank 0 is done first and must wait
              ++written;
              return absl::OkStatus();
            },
            [&, seq]() -> absl::StatusOr<std::string> {
              written_at_commit = written.load();
              return std::string("ckpt_") + std::to_string(seq);
            });
        EXPECT_TRUE(w.in_flight());
        out[r] = w.Wait();
        EXPECT_FALSE(w.in_flight());
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(written_at_commit.load(), 2 * world);  // the second commit saw all 2 x world parts
  ASSERT_TRUE(out[0].ok()) << out[0].status();
  EXPECT_EQ(*out[0], "ckpt_1");
  for (int r = 1; r < world; ++r) {
    ASSERT_TRUE(out[r].ok()) << out[r].status();
    EXPECT_EQ(*out[r], "");
  }
}

TEST_P(AsyncCheckpointWriterTest, OneFailedPartMeansNoCommitAndAnErrorOnEveryRank) {
  const int world = GetParam();
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::atomic<bool> committed{false};
  std::vector<absl::StatusOr<std::string>> out(world, std::string("unset"));
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      AsyncCheckpointWriter w(Opts(store, r, world));
      w.Start(
          7, [r, world] { return r == world - 1 ? absl::InternalError("disk full") : absl::OkStatus(); },
          [&]() -> absl::StatusOr<std::string> {
            committed = true;
            return std::string("x");
          });
      out[r] = w.Wait();
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_FALSE(committed.load());
  for (int r = 0; r < world; ++r) {
    ASSERT_FALSE(out[r].ok()) << "rank " << r;
    EXPECT_THAT(std::string(out[r].status().message()), HasSubstr("disk full")) << "rank " << r;
  }
}

TEST(AsyncCheckpointWriterDeadlineTest, MissingRankIsDeadlineExceededNamingItsKey) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  AsyncCheckpointWriter w(Opts(store, 0, 2, absl::Milliseconds(300)));
  bool committed = false;
  const absl::Time t0 = absl::Now();
  w.Start(3, [] { return absl::OkStatus(); }, [&]() -> absl::StatusOr<std::string> {
    committed = true;
    return std::string("x");
  });
  absl::StatusOr<std::string> r = w.Wait();
  EXPECT_FALSE(committed);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("test/3/done/1"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
}

TEST(AsyncCheckpointWriterDeadlineTest, DestructorCancelsTheWaitWithoutCommitting) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  bool committed = false;
  const absl::Time t0 = absl::Now();
  {
    AsyncCheckpointWriter w(Opts(store, 0, 2, absl::Minutes(5)));
    w.Start(1, [] { return absl::OkStatus(); }, [&]() -> absl::StatusOr<std::string> {
      committed = true;
      return std::string("x");
    });
    absl::SleepFor(absl::Milliseconds(50));
  }  // rank 1 never posts: the destructor must not wait 5 minutes
  EXPECT_FALSE(committed);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
}

INSTANTIATE_TEST_SUITE_P(Worlds, AsyncCheckpointWriterTest, ::testing::Values(1, 2, 3, 8));

}  // namespace
}  // namespace tpudist::train
