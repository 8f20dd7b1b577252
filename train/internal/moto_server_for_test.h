// Test-only: a moto S3 server (requirements.txt) on a free loopback port,
// started by a test and stopped by pid, and python/boto3 one-liners to look
// at and damage its objects from outside the code under test. Needs
// TPU_DIST_PYTHON_PATH (the venv's python) defined by the test target.
#ifndef TPU_DIST_TRAIN_INTERNAL_MOTO_SERVER_FOR_TEST_H_
#define TPU_DIST_TRAIN_INTERNAL_MOTO_SERVER_FOR_TEST_H_

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "testing/free_port.h"

extern char** environ;

namespace tpudist::train::internal {

inline constexpr char kPython[] = TPU_DIST_PYTHON_PATH;

// Runs `python -c code` with the environment (output dropped when `quiet`);
// its exit status. Bounded by the code itself (boto3's own timeouts).
inline int RunPython(const std::string& code, bool quiet = false) {
  pid_t pid = 0;
  const char* argv[] = {kPython, "-c", code.c_str(), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (quiet) {
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  }
  const int rc = posix_spawn(&pid, kPython, &fa, nullptr, const_cast<char**>(argv), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// A moto S3 server on 127.0.0.1:<free port> for the whole suite.
class MotoServer {
 public:
  static MotoServer* Start() {
    if (RunPython("import moto.server, flask", /*quiet=*/true) != 0) return nullptr;
    auto* m = new MotoServer;
    m->port_ = ::tpudist::test_support::FreePort();
    const std::string port = std::to_string(m->port_);
    const char* argv[] = {kPython, "-m", "moto.server", "-H", "127.0.0.1", "-p", port.c_str(), nullptr};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    const int rc = posix_spawn(&m->pid_, kPython, &fa, nullptr, const_cast<char**>(argv), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) m->pid_ = 0;
    // Ready when boto3 can create the bucket (30 s at most).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (m->pid_ != 0 && std::chrono::steady_clock::now() < deadline) {
      if (RunPython(m->Boto("c.create_bucket(Bucket='bkt')"), /*quiet=*/true) == 0) {
        m->ready_ = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return m;
  }
  ~MotoServer() {
    if (pid_ == 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {  // 10 s, then SIGKILL
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  bool ready() const { return ready_; }
  int port() const { return port_; }
  // Python that runs `stmt` with `c`, a boto3 S3 client on this server.
  std::string Boto(const std::string& stmt) const {
    return absl::StrCat("import boto3, botocore.config; c = boto3.client('s3', endpoint_url='http://127.0.0.1:", port_,
                        "', region_name='us-east-1', config=botocore.config.Config(connect_timeout=5, "
                        "read_timeout=30, retries={'max_attempts': 2})); ",
                        stmt);
  }

 private:
  pid_t pid_ = 0;
  int port_ = 0;
  bool ready_ = false;
};

}  // namespace tpudist::train::internal

#endif  // TPU_DIST_TRAIN_INTERNAL_MOTO_SERVER_FOR_TEST_H_
