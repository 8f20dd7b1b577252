// ForkRanks, WaitForRanks and ExitStatusCode (testing/forked_ranks.h): the
// GoogleTest-free half of the forked ranks (tpu_dist::testing_base), which the
// bench/ programs link.
#include "testing/forked_ranks.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tpudist::test_support {

int ExitStatusCode(const ChildResult& result) {
  if (result.killed_at_deadline) return -1;
  if (result.exited) return result.exit_code;
  return 128 + result.signal;
}

ForkedRanks ForkRanks(int world, bool quiet_followers) {
  ForkedRanks ranks;
  ranks.world = world;
  for (int r = 1; r < world; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      std::abort();
    }
    if (pid == 0) {
      ranks.rank = r;
      ranks.children.clear();
      if (quiet_followers) {
        const int null_fd = open("/dev/null", O_WRONLY);
        if (null_fd >= 0) dup2(null_fd, STDOUT_FILENO);
      }
      return ranks;
    }
    ranks.children.push_back(pid);
  }
  return ranks;
}

absl::Status WaitForRanks(const ForkedRanks& ranks, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string errors;
  for (size_t i = 0; i < ranks.children.size(); ++i) {
    const pid_t pid = ranks.children[i];
    const int rank = static_cast<int>(i) + 1;
    int status = 0;
    pid_t got = 0;
    while ((got = waitpid(pid, &status, WNOHANG)) == 0 && absl::Now() < deadline) {
      usleep(5000);
    }
    if (got == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      absl::StrAppend(&errors, " rank ", rank, " still running after ",
                      absl::FormatDuration(timeout), ", killed;");
    } else if (got < 0) {
      absl::StrAppend(&errors, " rank ", rank, " waitpid failed;");
    } else if (WIFSIGNALED(status)) {
      absl::StrAppend(&errors, " rank ", rank, " died on signal ", WTERMSIG(status), ";");
    } else if (WEXITSTATUS(status) != 0) {
      absl::StrAppend(&errors, " rank ", rank, " exited ", WEXITSTATUS(status), ";");
    }
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("forked ranks (world ", ranks.world, "):", errors));
}

}  // namespace tpudist::test_support
