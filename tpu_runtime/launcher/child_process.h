// ChildProcess: one launched rank. fork + execvp in its own process group,
// with the parent's environment overlaid by an EnvMap, and its stdout/stderr
// connected to non-blocking pipes that the supervisor polls. The child dies
// with its launcher: it gets SIGKILL when the thread that started it exits
// (PR_SET_PDEATHSIG), so kill -9 of tpurun leaves no rank running; start
// children from a thread that outlives them (tpurun: its main thread).
//
// Ownership: the object owns the pipe read ends; it does not wait for the
// child in its destructor (the supervisor reaps every child it starts and
// SIGKILLs the group of any it could not). Not thread-safe; one thread.
#ifndef TPU_DIST_TPU_RUNTIME_LAUNCHER_CHILD_PROCESS_H_
#define TPU_DIST_TPU_RUNTIME_LAUNCHER_CHILD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tpu_runtime/env_map.h"
#include "tpu_runtime/launcher/exit_status.h"

namespace tpudist::tpu_runtime::launcher {

// The parent environment (`base`, e.g. from environ) with `overlay` applied on
// top: overlay entries replace base entries of the same name. Pure.
// Returns "NAME=value" strings, sorted by name.
std::vector<std::string> OverlayEnvironment(const char* const* base, const EnvMap& overlay);

class ChildProcess {
 public:
  // Starts argv[0] (searched in PATH like execvp) with args argv[1..] and the
  // environment OverlayEnvironment(environ, env). Waits (at most
  // `exec_timeout`) until the exec has happened, so that a missing binary is
  // an error here (NotFound / PermissionDenied naming the binary), not a rank
  // failure. REQUIRES: !argv.empty().
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(
      const std::vector<std::string>& argv, const EnvMap& env,
      absl::Duration exec_timeout = absl::Seconds(10));
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Read ends of the child's stdout / stderr; -1 once closed by CloseStdout()
  // / CloseStderr() (the supervisor closes each at EOF).
  int stdout_fd() const { return stdout_fd_; }
  int stderr_fd() const { return stderr_fd_; }
  void CloseStdout();
  void CloseStderr();

  // Sends `signal` to the child's whole process group (the rank and anything
  // it spawned). Harmless after the child was reaped: then it only reaches
  // leftover group members, if any.
  void SignalGroup(int signal);

  // Non-blocking waitpid. Returns the exit status once the child has ended
  // (and from then on the same value), std::nullopt while it runs.
  std::optional<ExitStatus> TryReap();
  const std::optional<ExitStatus>& exit_status() const { return exit_status_; }

 private:
  ChildProcess(pid_t pid, int out_fd, int err_fd)
      : pid_(pid), stdout_fd_(out_fd), stderr_fd_(err_fd) {}
  pid_t pid_;
  int stdout_fd_;
  int stderr_fd_;
  std::optional<ExitStatus> exit_status_;
};

}  // namespace tpudist::tpu_runtime::launcher

#endif  // TPU_DIST_TPU_RUNTIME_LAUNCHER_CHILD_PROCESS_H_
