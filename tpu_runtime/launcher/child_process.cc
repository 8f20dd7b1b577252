#include "tpu_runtime/launcher/child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

extern char** environ;

namespace tpudist::tpu_runtime::launcher {
namespace {

void CloseIfOpen(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

// Runs in the forked child: only async-signal-safe calls. Never returns.
[[noreturn]] void ExecChild(char* const* argv, char* const* envp, int out_w, int err_w,
                            int status_w, pid_t launcher) {
  setpgid(0, 0);  // own process group, so the launcher can signal the group
  // Dies with the launcher (kill -9 of tpurun must not leave ranks running);
  // the check closes the race with a launcher that died before prctl.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(127);
  sigset_t empty;
  sigemptyset(&empty);
  sigprocmask(SIG_SETMASK, &empty, nullptr);  // undo the SignalWatcher's mask
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) signal(sig, SIG_DFL);
  if (dup2(out_w, STDOUT_FILENO) < 0 || dup2(err_w, STDERR_FILENO) < 0) {
    int err = errno;
    (void)!write(status_w, &err, sizeof(err));
    _exit(127);
  }
  int null_fd = open("/dev/null", O_RDONLY);  // ranks never read the terminal
  if (null_fd >= 0) {
    dup2(null_fd, STDIN_FILENO);
    close(null_fd);
  }
  execvpe(argv[0], argv, envp);
  int err = errno;
  (void)!write(status_w, &err, sizeof(err));  // status_w is O_CLOEXEC
  _exit(127);
}

}  // namespace

std::vector<std::string> OverlayEnvironment(const char* const* base, const EnvMap& overlay) {
  std::map<std::string, std::string> merged;
  for (const char* const* e = base; e != nullptr && *e != nullptr; ++e) {
    absl::string_view entry(*e);
    size_t eq = entry.find('=');
    if (eq == absl::string_view::npos) continue;
    merged[std::string(entry.substr(0, eq))] = std::string(entry.substr(eq + 1));
  }
  for (const auto& [name, value] : overlay) merged[name] = value;
  std::vector<std::string> out;
  out.reserve(merged.size());
  for (const auto& [name, value] : merged) out.push_back(absl::StrCat(name, "=", value));
  return out;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv, const EnvMap& env, absl::Duration exec_timeout) {
  if (argv.empty()) return absl::InvalidArgumentError("ChildProcess::Start: empty argv");
  // Everything the child needs is built before fork: no allocation after it.
  std::vector<std::string> env_strings = OverlayEnvironment(environ, env);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  std::vector<char*> argvp;
  for (std::string& s : argv_copy) argvp.push_back(s.data());
  argvp.push_back(nullptr);

  int out_pipe[2], err_pipe[2], status_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return absl::InternalError("pipe2 (stdout) failed");
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]), close(out_pipe[1]);
    return absl::InternalError("pipe2 (stderr) failed");
  }
  if (pipe2(status_pipe, O_CLOEXEC) != 0) {
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    return absl::InternalError("pipe2 (exec status) failed");
  }
  const pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    ExecChild(argvp.data(), envp.data(), out_pipe[1], err_pipe[1], status_pipe[1], launcher);
  }
  int fork_errno = errno;
  for (int fd : {out_pipe[1], err_pipe[1], status_pipe[1]}) close(fd);
  if (pid < 0) {
    for (int fd : {out_pipe[0], err_pipe[0], status_pipe[0]}) close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", strerror(fork_errno)));
  }
  setpgid(pid, pid);  // also here, so the group exists before we ever signal it
  auto child = std::unique_ptr<ChildProcess>(new ChildProcess(pid, out_pipe[0], err_pipe[0]));
  fcntl(child->stdout_fd_, F_SETFL, O_NONBLOCK);
  fcntl(child->stderr_fd_, F_SETFL, O_NONBLOCK);

  // EOF on the status pipe = exec succeeded; an int = exec's errno.
  pollfd pfd{status_pipe[0], POLLIN, 0};
  int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(exec_timeout));
  int ready;
  do {
    ready = poll(&pfd, 1, timeout_ms);
  } while (ready < 0 && errno == EINTR);
  int exec_errno = 0;
  ssize_t n = ready > 0 ? read(status_pipe[0], &exec_errno, sizeof(exec_errno)) : -1;
  close(status_pipe[0]);
  if (ready == 0) {
    child->SignalGroup(SIGKILL);
    waitpid(pid, nullptr, 0);  // SIGKILLed: returns promptly
    return absl::DeadlineExceededError(absl::StrCat("exec of ", argv[0], " did not complete in ",
                                                    absl::FormatDuration(exec_timeout)));
  }
  if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
    waitpid(pid, nullptr, 0);  // the child _exit()s right after writing
    std::string msg = absl::StrCat("cannot execute ", argv[0], ": ", strerror(exec_errno));
    if (exec_errno == ENOENT) return absl::NotFoundError(msg);
    if (exec_errno == EACCES) return absl::PermissionDeniedError(msg);
    return absl::FailedPreconditionError(msg);
  }
  return child;
}

ChildProcess::~ChildProcess() {
  CloseIfOpen(&stdout_fd_);
  CloseIfOpen(&stderr_fd_);
}

void ChildProcess::CloseStdout() { CloseIfOpen(&stdout_fd_); }
void ChildProcess::CloseStderr() { CloseIfOpen(&stderr_fd_); }

void ChildProcess::SignalGroup(int signal) { kill(-pid_, signal); }

std::optional<ExitStatus> ChildProcess::TryReap() {
  if (exit_status_.has_value()) return exit_status_;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_ && (WIFEXITED(status) || WIFSIGNALED(status))) {
    exit_status_ = ExitStatus::FromWaitStatus(status);
  }
  return exit_status_;
}

}  // namespace tpudist::tpu_runtime::launcher
