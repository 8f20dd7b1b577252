// SignalWatcher: turns the launcher's SIGINT / SIGTERM / SIGHUP (and SIGCHLD,
// to wake the supervisor when a child exits) into readable events on a file
// descriptor, via signalfd(2). No code runs in an asynchronous signal handler.
//
// While a SignalWatcher lives, those signals are blocked in the calling thread
// (pthread_sigmask) and queue on the signalfd instead; the destructor restores
// the previous mask and closes the fd. A process-directed signal is delivered
// to any thread that does not block it, so a multi-threaded program must block
// them in its other threads too (threads created after the watcher inherit the
// mask). Children must reset their mask before exec (ChildProcess does).
//
// Thread-safety: not thread-safe; create, poll and destroy on one thread.
#ifndef TPU_DIST_TPU_RUNTIME_LAUNCHER_SIGNAL_WATCHER_H_
#define TPU_DIST_TPU_RUNTIME_LAUNCHER_SIGNAL_WATCHER_H_

#include <signal.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace tpudist::tpu_runtime::launcher {

class SignalWatcher {
 public:
  // Starts watching SIGINT, SIGTERM, SIGHUP and SIGCHLD.
  static absl::StatusOr<std::unique_ptr<SignalWatcher>> Create();
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  // Pollable (POLLIN) while signals are queued. Owned by the watcher.
  int fd() const { return fd_; }

  // Reads every queued signal without blocking, in arrival order (SIGCHLD
  // included; the caller decides what to do with each). Empty when none.
  std::vector<int> ReadPending();

 private:
  SignalWatcher(int fd, sigset_t old_mask) : fd_(fd), old_mask_(old_mask) {}
  int fd_;
  sigset_t old_mask_;
};

}  // namespace tpudist::tpu_runtime::launcher

#endif  // TPU_DIST_TPU_RUNTIME_LAUNCHER_SIGNAL_WATCHER_H_
