// RunDirLock: at most one job writes a run directory at a time.
//
// Rank 0 of gemma_finetune takes it before touching <storage>/<run_name>
// (checkpoints, metrics.jsonl) and holds it until it returns. It is an
// exclusive flock(2) on <run_dir>/.run.lock, opened O_CLOEXEC so that no
// child process inherits it. The holder writes "pid=<pid> host=<host>
// since=<UTC time>" into the file; a process that finds the lock taken
// fails with FailedPrecondition quoting that:
//
//   run directory '/ft/run' is in use by pid 4242 on host tpu-vm-0 (since
//   2026-12-04T10:00:00Z): another job is writing this run (lock file
//   /ft/run/.run.lock)
//
// Stale locks: the kernel drops a flock when the last descriptor of its
// open file closes, i.e. when the holder exits however it exits (SIGKILL
// included), so a dead holder's lock is free for the next process; only its
// text remains in the file, and is overwritten. Nothing is ever unlinked
// (unlinking a lock file lets two processes lock two different inodes).
// Shared filesystems: NFS (Linux >= 2.6.12 maps flock to NFS byte-range
// locks) works across hosts; filesystems without locking (some FUSE mounts)
// fail Acquire with the errno text, rather than pretending.
//
// Move-only; the destructor releases. Thread-compatible.
#ifndef TPU_DIST_TRAIN_RUN_DIR_LOCK_H_
#define TPU_DIST_TRAIN_RUN_DIR_LOCK_H_

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tpudist::train {

inline constexpr char kRunDirLockFile[] = ".run.lock";

class RunDirLock {
 public:
  // Creates run_dir if needed and takes the lock, retrying every 50 ms for
  // up to `wait` (zero: one try). FailedPrecondition naming the holder's pid
  // and host when another process still holds it; other errors name the
  // lock file and the errno text.
  static absl::StatusOr<RunDirLock> Acquire(const std::string& run_dir,
                                            absl::Duration wait);

  RunDirLock(RunDirLock&& other) noexcept;
  RunDirLock& operator=(RunDirLock&& other) noexcept;
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  ~RunDirLock();

  const std::string& path() const { return path_; }  // the lock file

 private:
  RunDirLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  void Release();

  int fd_ = -1;
  std::string path_;
};

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_RUN_DIR_LOCK_H_
