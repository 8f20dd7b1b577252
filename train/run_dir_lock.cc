#include "train/run_dir_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "train/internal/fs_util.h"

namespace tpudist::train {
namespace {

constexpr absl::Duration kPoll = absl::Milliseconds(50);

std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

absl::Status ErrnoStatus(absl::string_view op, const std::string& path) {
  return absl::InternalError(absl::StrCat(op, " '", path, "': ", std::strerror(errno)));
}

// "key=value" words of the lock file.
struct Holder {
  std::string pid, host, since;
};

Holder ParseHolder(absl::string_view text) {
  Holder h;
  for (absl::string_view word : absl::StrSplit(absl::StripAsciiWhitespace(text), ' ')) {
    std::pair<std::string, std::string> kv = absl::StrSplit(word, absl::MaxSplits('=', 1));
    if (kv.first == "pid") h.pid = kv.second;
    if (kv.first == "host") h.host = kv.second;
    if (kv.first == "since") h.since = kv.second;
  }
  return h;
}

bool DeadHere(const Holder& h) {
  int pid = 0;
  return h.host == HostName() && absl::SimpleAtoi(h.pid, &pid) && pid > 0 && ::kill(pid, 0) != 0 &&
         errno == ESRCH;
}

// Who holds the lock, in words. The holder writes its record just after
// locking, so an empty record, or one naming a dead process of this host
// (a previous holder's), may be from the instant in between: re-read for a
// short while before saying so.
std::string DescribeHolder(const std::string& path) {
  Holder h;
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<std::string> text = internal::ReadFile(path);
    h = ParseHolder(text.ok() ? *text : "");
    if (!h.pid.empty() && !DeadHere(h)) {
      return absl::StrCat("pid ", h.pid, " on host ", h.host,
                          h.since.empty() ? "" : absl::StrCat(" (since ", h.since, ")"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (h.pid.empty()) return "another process (it has not recorded itself)";
  return absl::StrCat("another process (the record names pid ", h.pid,
                      ", no longer running: the holder did not record itself)");
}

}  // namespace

absl::StatusOr<RunDirLock> RunDirLock::Acquire(const std::string& run_dir, absl::Duration wait) {
  if (absl::Status st = internal::MakeDirs(run_dir); !st.ok()) return st;
  std::string path = absl::StrCat(run_dir, "/", kRunDirLockFile);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("open", path);
  const absl::Time deadline = absl::Now() + wait;
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) break;
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) {
      absl::Status st = ErrnoStatus("flock", path);
      ::close(fd);
      return st;
    }
    if (absl::Now() >= deadline) {
      ::close(fd);
      return absl::FailedPreconditionError(absl::StrCat(
          "run directory '", run_dir, "' is in use by ", DescribeHolder(path),
          ": another job is writing this run (lock file ", path, ")"));
    }
    absl::SleepFor(kPoll);
  }
  const std::string record =
      absl::StrCat("pid=", ::getpid(), " host=", HostName(), " since=",
                   absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone()), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, record.data(), record.size(), 0) !=
                                     static_cast<ssize_t>(record.size())) {
    absl::Status st = ErrnoStatus("write", path);
    ::close(fd);
    return st;
  }
  return RunDirLock(fd, std::move(path));
}

RunDirLock::RunDirLock(RunDirLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

RunDirLock& RunDirLock::operator=(RunDirLock&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

RunDirLock::~RunDirLock() { Release(); }

void RunDirLock::Release() {
  if (fd_ >= 0) ::close(fd_);  // drops the flock
  fd_ = -1;
}

}  // namespace tpudist::train
