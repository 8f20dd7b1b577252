#include "tpu_runtime/launcher/exit_status.h"

#include <signal.h>
#include <sys/wait.h>

#include "absl/strings/str_cat.h"

namespace tpudist::tpu_runtime::launcher {

ExitStatus ExitStatus::FromWaitStatus(int wait_status) {
  if (WIFSIGNALED(wait_status)) return Signaled(WTERMSIG(wait_status));
  return Exited(WEXITSTATUS(wait_status));
}

std::string SignalName(int signal) {
  switch (signal) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGCHLD: return "SIGCHLD";
    case SIGCONT: return "SIGCONT";
    case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return absl::StrCat("signal ", signal);
  }
}

std::string Describe(const ExitStatus& status) {
  if (status.kind == ExitStatus::Kind::kSignaled) {
    return absl::StrCat("killed by signal ", SignalName(status.signal));
  }
  if (status.code == 0) return "exited normally";
  return absl::StrCat("exit status ", status.code);
}

}  // namespace tpudist::tpu_runtime::launcher
