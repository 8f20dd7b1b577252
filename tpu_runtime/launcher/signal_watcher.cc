#include "tpu_runtime/launcher/signal_watcher.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tpudist::tpu_runtime::launcher {

absl::StatusOr<std::unique_ptr<SignalWatcher>> SignalWatcher::Create() {
  sigset_t watched;
  sigemptyset(&watched);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&watched, sig);
  sigset_t old_mask;
  int rc = pthread_sigmask(SIG_BLOCK, &watched, &old_mask);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("pthread_sigmask: ", strerror(rc)));
  }
  int fd = signalfd(-1, &watched, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    return absl::InternalError(absl::StrCat("signalfd: ", strerror(err)));
  }
  return std::unique_ptr<SignalWatcher>(new SignalWatcher(fd, old_mask));
}

SignalWatcher::~SignalWatcher() {
  close(fd_);
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

std::vector<int> SignalWatcher::ReadPending() {
  std::vector<int> signals;
  signalfd_siginfo info[16];
  while (true) {
    ssize_t n = read(fd_, info, sizeof(info));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EAGAIN: nothing more queued
    for (size_t i = 0; i < static_cast<size_t>(n) / sizeof(info[0]); ++i) {
      signals.push_back(static_cast<int>(info[i].ssi_signo));
    }
  }
  return signals;
}

}  // namespace tpudist::tpu_runtime::launcher
