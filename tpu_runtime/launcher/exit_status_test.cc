#include "tpu_runtime/launcher/exit_status.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace tpudist::tpu_runtime::launcher {
namespace {

TEST(ExitStatusTest, DescribesExitsAndSignals) {
  EXPECT_EQ(Describe(ExitStatus::Exited(0)), "exited normally");
  EXPECT_EQ(Describe(ExitStatus::Exited(3)), "exit status 3");
  EXPECT_EQ(Describe(ExitStatus::Signaled(SIGKILL)), "killed by signal SIGKILL");
  EXPECT_EQ(Describe(ExitStatus::Signaled(SIGSEGV)), "killed by signal SIGSEGV");
  EXPECT_EQ(SignalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(SignalName(42), "signal 42");
}

TEST(ExitStatusTest, ShellCodeAndSuccess) {
  EXPECT_TRUE(ExitStatus::Exited(0).success());
  EXPECT_FALSE(ExitStatus::Exited(1).success());
  EXPECT_FALSE(ExitStatus::Signaled(SIGTERM).success());
  EXPECT_EQ(ExitStatus::Exited(3).ShellCode(), 3);
  EXPECT_EQ(ExitStatus::Signaled(SIGKILL).ShellCode(), 137);
}

// Oracle: the kernel's own wait status of real children.
TEST(ExitStatusTest, FromWaitStatusOfRealChildren) {
  pid_t exits = fork();
  if (exits == 0) _exit(7);
  int status = 0;
  ASSERT_EQ(waitpid(exits, &status, 0), exits);
  EXPECT_EQ(ExitStatus::FromWaitStatus(status), ExitStatus::Exited(7));

  pid_t killed = fork();
  if (killed == 0) {
    raise(SIGKILL);
    _exit(0);
  }
  ASSERT_EQ(waitpid(killed, &status, 0), killed);
  EXPECT_EQ(ExitStatus::FromWaitStatus(status), ExitStatus::Signaled(SIGKILL));
}

}  // namespace
}  // namespace tpudist::tpu_runtime::launcher
