#include "bench/busy_load.h"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tpudist::bench {
namespace {

// The child's whole life: spin until the parent goes away (or a SIGKILL).
[[noreturn]] void Spin(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0);  // the parent died before prctl
  volatile uint64_t sink = 0;
  for (uint64_t i = 0;; ++i) {
    sink = sink + i;
    if ((i & ((uint64_t{1} << 24) - 1)) == 0 && getppid() != parent) _exit(0);
  }
}

int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  const int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}

}  // namespace

absl::StatusOr<BusyLoad> BusyLoad::Start(int per_core) {
  BusyLoad load;
  load.owner_ = getpid();
  const int n = per_core > 0 ? per_core * UsableCores() : 0;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = fork();
    if (pid < 0) {
      const int err = errno;
      load.Stop();
      return absl::InternalError(
          absl::StrCat("busy load: fork ", i + 1, " of ", n, " failed: ", std::strerror(err)));
    }
    if (pid == 0) Spin(load.owner_);
    load.pids_.push_back(pid);
  }
  return load;
}

BusyLoad::BusyLoad(BusyLoad&& other) noexcept
    : owner_(other.owner_), pids_(std::move(other.pids_)) {
  other.pids_.clear();
}

BusyLoad& BusyLoad::operator=(BusyLoad&& other) noexcept {
  if (this != &other) {
    Stop();
    owner_ = other.owner_;
    pids_ = std::move(other.pids_);
    other.pids_.clear();
  }
  return *this;
}

void BusyLoad::Stop() {
  if (getpid() != owner_) return;
  for (pid_t pid : pids_) kill(pid, SIGKILL);
  for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  pids_.clear();
}

}  // namespace tpudist::bench
