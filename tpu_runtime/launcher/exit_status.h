// How a child process ended, as a value, and the words tpurun uses for it.
//
// Pure functions of a waitpid() status; thread-safe.
#ifndef TPU_DIST_TPU_RUNTIME_LAUNCHER_EXIT_STATUS_H_
#define TPU_DIST_TPU_RUNTIME_LAUNCHER_EXIT_STATUS_H_

#include <string>

namespace tpudist::tpu_runtime::launcher {

struct ExitStatus {
  enum class Kind { kExited, kSignaled };
  Kind kind = Kind::kExited;
  int code = 0;    // exit status when kExited
  int signal = 0;  // signal number when kSignaled

  static ExitStatus Exited(int code) { return {Kind::kExited, code, 0}; }
  static ExitStatus Signaled(int signal) { return {Kind::kSignaled, 0, signal}; }
  // From a raw waitpid() status. REQUIRES: WIFEXITED or WIFSIGNALED.
  static ExitStatus FromWaitStatus(int wait_status);

  bool success() const { return kind == Kind::kExited && code == 0; }
  // The shell's convention: the exit status, or 128 + signal number.
  int ShellCode() const { return kind == Kind::kExited ? code : 128 + signal; }
  bool operator==(const ExitStatus& o) const {
    return kind == o.kind && code == o.code && signal == o.signal;
  }
};

// "SIGKILL", "SIGTERM", ...; "signal 42" for numbers without a name.
std::string SignalName(int signal);

// "exit status 3", "killed by signal SIGKILL", "exited normally" (status 0).
std::string Describe(const ExitStatus& status);

}  // namespace tpudist::tpu_runtime::launcher

#endif  // TPU_DIST_TPU_RUNTIME_LAUNCHER_EXIT_STATUS_H_
