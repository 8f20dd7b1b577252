// Test helpers for coordination_test: child processes that re-execute this
// test binary in a "child role" (fork + exec, so the child starts with fresh
// gRPC and Gloo state instead of inheriting the parent's threads), and bounded
// waits. Header-only, torch-free and GoogleTest-free (tpu_dist::testing_base).
#ifndef TPU_DIST_TESTING_COORDINATION_CHILD_H_
#define TPU_DIST_TESTING_COORDINATION_CHILD_H_

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

extern char** environ;

namespace tpudist::test_support {

// The gtest filter of the test that runs child roles (defined in
// coordination_store_test.cc); the role and its arguments travel in env.
inline constexpr char kChildTest[] = "CoordinationChild.Main";
inline constexpr char kRoleEnv[] = "TPUDIST_COORD_CHILD_ROLE";

// Starts this binary as a child running `role`, with `env` added, under
// `wrapper` (e.g. {"/usr/sbin/ip", "netns", "exec", "ns0"}) when not empty.
// Returns the pid, or -1.
inline pid_t SpawnChild(const std::string& role,
                        const std::map<std::string, std::string>& env,
                        const std::vector<std::string>& wrapper = {}) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return -1;
  exe[n] = '\0';
  std::vector<std::string> strings = wrapper;
  strings.push_back(exe);
  strings.push_back(std::string("--gtest_filter=") + kChildTest);
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) envs.emplace_back(*e);
  envs.push_back(std::string(kRoleEnv) + "=" + role);
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (auto& s : strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

// Waits for `pid` until `timeout`; SIGKILLs and reaps it on timeout.
// Returns the exit code, 128+signal when killed by a signal, -1 on timeout.
inline int WaitChild(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -2;
    }
    if (r < 0) return -3;
    if (absl::Now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

// Polls `done` every 5 ms until it holds or `timeout` passes.
inline bool WaitFor(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

inline std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : fallback;
}

}  // namespace tpudist::test_support

#endif  // TPU_DIST_TESTING_COORDINATION_CHILD_H_
