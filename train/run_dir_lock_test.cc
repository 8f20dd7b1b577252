#include "train/run_dir_lock.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "train/internal/fs_util.h"
#include "train/internal/test_temp_dir.h"

namespace tpudist::train {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Host() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// A child process that takes the lock, says so on a pipe and then sleeps
// until killed (or, with hold_ms, exits after that long).
pid_t ForkHolder(const std::string& run_dir, int hold_ms = -1) {
  int ready[2];
  if (pipe(ready) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(ready[0]);
    auto lock = RunDirLock::Acquire(run_dir, absl::ZeroDuration());
    const char ok = lock.ok() ? 'y' : 'n';
    (void)!write(ready[1], &ok, 1);
    if (hold_ms >= 0) {
      usleep(static_cast<useconds_t>(hold_ms) * 1000);
      _exit(0);
    }
    for (;;) pause();
  }
  close(ready[1]);
  char c = 'n';
  (void)!read(ready[0], &c, 1);
  close(ready[0]);
  return c == 'y' ? pid : -1;
}

TEST(RunDirLockTest, SecondHolderFailsNamingTheFirst) {
  internal::TestTempDir tmp;
  const std::string dir = tmp.path() + "/run";
  auto first = RunDirLock::Acquire(dir, absl::ZeroDuration());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->path(), dir + "/.run.lock");
  // flock is per open file: a second open, even in this process, conflicts.
  const absl::Time t0 = absl::Now();
  auto second = RunDirLock::Acquire(dir, absl::ZeroDuration());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));  // fails fast
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(second.status().message()),
              AllOf(HasSubstr(absl::StrCat("in use by pid ", getpid(), " on host ", Host(), " (since ")),
                    HasSubstr(dir + "/.run.lock")));
  // Released by the destructor (and by moving over it).
  RunDirLock moved = *std::move(first);
  moved = *RunDirLock::Acquire(tmp.path() + "/other", absl::ZeroDuration());
  EXPECT_TRUE(RunDirLock::Acquire(dir, absl::ZeroDuration()).ok());
}

TEST(RunDirLockTest, OtherProcessHoldsThenDiesAndTheLockIsTakenOver) {
  internal::TestTempDir tmp;
  const std::string dir = tmp.path() + "/run";
  const pid_t child = ForkHolder(dir);
  ASSERT_GT(child, 0);
  auto busy = RunDirLock::Acquire(dir, absl::Milliseconds(120));  // waits, then gives up
  ASSERT_FALSE(busy.ok());
  EXPECT_THAT(std::string(busy.status().message()), HasSubstr(absl::StrCat("in use by pid ", child, " on host ")));
  // SIGKILL: no destructor runs, the kernel drops the flock anyway.
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  auto mine = RunDirLock::Acquire(dir, absl::ZeroDuration());
  ASSERT_TRUE(mine.ok()) << mine.status();
  auto record = internal::ReadFile(dir + "/.run.lock");
  ASSERT_TRUE(record.ok());
  EXPECT_THAT(*record, HasSubstr(absl::StrCat("pid=", getpid(), " host=")));  // the dead pid's text is gone
}

TEST(RunDirLockTest, WaitsForAHolderThatLeavesInTime) {
  internal::TestTempDir tmp;
  const std::string dir = tmp.path() + "/run";
  const pid_t child = ForkHolder(dir, /*hold_ms=*/200);
  ASSERT_GT(child, 0);
  auto lock = RunDirLock::Acquire(dir, absl::Seconds(10));
  EXPECT_TRUE(lock.ok()) << lock.status();
  waitpid(child, nullptr, 0);
}

}  // namespace
}  // namespace tpudist::train
