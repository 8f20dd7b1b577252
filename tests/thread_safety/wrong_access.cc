// The thread-safety check's own test (tools/thread_safety_check.py
// --expect-error): compiled with the flags of a checked library unit, this
// file must compile cleanly as it is and must be rejected with a
// -Wthread-safety error with each -DTPU_DIST_WRONG_ACCESS=<case>, so the
// check in CI is known to catch a wrong access, not merely to run.
// Never linked into anything.
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tpudist::thread_safety_check {

class Counter {
 public:
  int64_t Get() ABSL_LOCKS_EXCLUDED(mu_) {
#if TPU_DIST_WRONG_ACCESS == 1
    return value_;  // a GUARDED_BY member read without its lock
#elif TPU_DIST_WRONG_ACCESS == 2
    return GetLocked();  // a helper that REQUIRES the lock, called without it
#else
    absl::MutexLock lock(&mu_);
    return GetLocked();
#endif
  }

  void Add(int64_t n) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
#if TPU_DIST_WRONG_ACCESS == 3
    mu_.Unlock();  // released early: the write below is unguarded
#endif
    value_ += n;
#if TPU_DIST_WRONG_ACCESS == 3
    mu_.Lock();
#endif
  }

 private:
  int64_t GetLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return value_; }

  absl::Mutex mu_;
  int64_t value_ ABSL_GUARDED_BY(mu_) = 0;
};

// Keeps the class odr-used so every member function is analysed.
int64_t UseCounter() {
  Counter c;
  c.Add(1);
  return c.Get();
}

}  // namespace tpudist::thread_safety_check
