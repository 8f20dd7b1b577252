// RunForkedRanks (testing/forked_ranks.h): the GoogleTest half of the forked
// ranks, in tpu_dist::testing; ForkRanks and WaitForRanks are in
// forked_ranks.cc (tpu_dist::testing_base).
#include "testing/forked_ranks.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tpudist::test_support {
namespace {

struct Child {
  pid_t pid = -1;
  int fd = -1;  // read end of the report pipe; -1 once at EOF
  bool reaped = false;
  ChildResult result;
};

// The child's side: never returns.
[[noreturn]] void RunChild(int rank, int write_fd, pid_t parent, const ChildBody& body) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(97);  // the parent died before prctl
  std::string report;
  int code = 99;
  try {
    code = body(rank, &report);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d threw: %s\n", rank, e.what());
    code = 98;
  } catch (...) {
    std::fprintf(stderr, "rank %d threw a non-std::exception\n", rank);
    code = 98;
  }
  size_t done = 0;
  while (done < report.size()) {
    const ssize_t n = write(write_fd, report.data() + done, report.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  _exit(code);
}

// Reads what is available now; closes the pipe at EOF.
void Drain(Child& c) {
  if (c.fd < 0) return;
  char buf[4096];
  ssize_t n;
  while ((n = read(c.fd, buf, sizeof(buf))) > 0) c.result.report.append(buf, n);
  if (n == 0) {
    close(c.fd);
    c.fd = -1;
  }
}

void Record(Child& c, int status) {
  c.reaped = true;
  c.result.exited = WIFEXITED(status);
  if (WIFEXITED(status)) c.result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) c.result.signal = WTERMSIG(status);
}

}  // namespace

std::vector<ChildResult> RunForkedRanks(const std::vector<int>& ranks, const ChildBody& body,
                                        const ForkOptions& options) {
  const pid_t parent = getpid();
  std::vector<Child> children(ranks.size());
  std::vector<pid_t> pids;
  for (size_t i = 0; i < ranks.size(); ++i) {
    Child& c = children[i];
    c.result.rank = ranks[i];
    int fds[2];
    if (pipe(fds) != 0) {
      ADD_FAILURE() << "RunForkedRanks: pipe failed for rank " << ranks[i];
      c.reaped = true;
      continue;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      RunChild(ranks[i], fds[1], parent, body);
    }
    close(fds[1]);
    if (pid < 0) {
      ADD_FAILURE() << "RunForkedRanks: fork failed for rank " << ranks[i];
      close(fds[0]);
      c.reaped = true;
      continue;
    }
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    c.pid = pid;
    c.fd = fds[0];
    c.result.pid = pid;
    pids.push_back(pid);
  }
  if (options.on_started) options.on_started(pids);

  const absl::Time deadline = absl::Now() + options.deadline;
  auto all_reaped = [&] {
    for (const Child& c : children) {
      if (!c.reaped) return false;
    }
    return true;
  };
  while (!all_reaped() && absl::Now() < deadline) {
    std::vector<pollfd> pfds;
    for (const Child& c : children) {
      if (c.fd >= 0) pfds.push_back({c.fd, POLLIN, 0});
    }
    poll(pfds.data(), pfds.size(), 10);  // at most 10 ms between reaping passes
    for (Child& c : children) {
      Drain(c);
      if (c.reaped) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) Record(c, status);
    }
  }
  for (Child& c : children) {
    if (!c.reaped) {
      kill(c.pid, SIGKILL);
      int status = 0;
      waitpid(c.pid, &status, 0);  // bounded: SIGKILL cannot be caught
      Record(c, status);
      c.result.killed_at_deadline = true;
    }
    Drain(c);  // the child is gone: what it wrote is all there is
    if (c.fd >= 0) close(c.fd);
  }
  std::vector<ChildResult> results;
  results.reserve(children.size());
  for (Child& c : children) results.push_back(std::move(c.result));
  return results;
}

std::vector<ChildResult> RunForkedRanks(int world, const ChildBody& body,
                                        const ForkOptions& options) {
  std::vector<int> ranks(world);
  for (int r = 0; r < world; ++r) ranks[r] = r;
  return RunForkedRanks(ranks, body, options);
}

}  // namespace tpudist::test_support
