#include "collectives/hierarchical_backend_pipeline.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace tpudist::collectives {
namespace {

absl::Status Call(const std::function<absl::Status(int64_t)>& f, int64_t k) {
  return f ? f(k) : absl::OkStatus();
}

// Shared between the caller (shm stages) and the helper (tcp stage).
struct State {
  absl::Mutex mu;
  int64_t posted ABSL_GUARDED_BY(mu) = 0;  // chunks whose `before` finished
  int64_t done ABSL_GUARDED_BY(mu) = 0;    // chunks whose `tcp` finished
  int first ABSL_GUARDED_BY(mu) = 0;       // 0: no failure, 1: shm, 2: tcp
  absl::Status status ABSL_GUARDED_BY(mu);

  // Records a failure; true if it is the first.
  bool Fail(int who, const absl::Status& s) {
    absl::MutexLock lock(&mu);
    if (first != 0) return false;
    first = who;
    status = s;
    return true;
  }
};

}  // namespace

RailPipelineResult RunRailPipeline(int64_t chunks, const RailStages& stages,
                                   absl::Time deadline) {
  if (chunks <= 1) {
    if (absl::Status s = Call(stages.before, 0); !s.ok()) return {s, false};
    if (absl::Status s = stages.tcp(0); !s.ok()) return {s, true};
    if (absl::Status s = Call(stages.after, 0); !s.ok()) return {s, false};
    return {};
  }
  const absl::Time wait_until = deadline + absl::Seconds(1);
  State st;
  auto fail_shm = [&](const absl::Status& s) {
    if (st.Fail(1, s) && stages.abort_tcp) stages.abort_tcp(s);
  };
  std::thread helper([&] {
    for (int64_t k = 0; k < chunks; ++k) {
      bool in_time;
      {
        absl::MutexLock lock(&st.mu);
        auto ready = [&st, k]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
          return st.posted > k || st.first != 0;
        };
        in_time = st.mu.AwaitWithDeadline(absl::Condition(&ready), wait_until);
        if (in_time && st.first != 0) return;
      }
      if (!in_time) {
        fail_shm(absl::DeadlineExceededError(absl::StrCat(
            "multi-rail pipeline: chunk ", k, " of ", chunks,
            " not ready for the network by the op deadline")));
        return;
      }
      if (absl::Status s = stages.tcp(k); !s.ok()) {
        if (st.Fail(2, s) && stages.abort_shm) stages.abort_shm(s);
        return;
      }
      absl::MutexLock lock(&st.mu);
      st.done = k + 1;
    }
  });
  // Waits for tcp(k); false once a stage has failed (or on the deadline).
  auto wait_tcp = [&](int64_t k) {
    {
      absl::MutexLock lock(&st.mu);
      auto ready = [&st, k]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
        return st.done > k || st.first != 0;
      };
      if (st.mu.AwaitWithDeadline(absl::Condition(&ready), wait_until)) return st.first == 0;
    }
    fail_shm(absl::DeadlineExceededError(absl::StrCat(
        "multi-rail pipeline: chunk ", k, " of ", chunks,
        " still on the network past the op deadline")));
    return false;
  };
  for (int64_t k = 0; k <= chunks; ++k) {
    if (k < chunks) {
      if (absl::Status s = Call(stages.before, k); !s.ok()) {
        fail_shm(s);
        break;
      }
      absl::MutexLock lock(&st.mu);
      st.posted = k + 1;
    }
    if (k >= 1) {
      if (!wait_tcp(k - 1)) break;
      if (absl::Status s = Call(stages.after, k - 1); !s.ok()) {
        fail_shm(s);
        break;
      }
    }
  }
  helper.join();
  absl::MutexLock lock(&st.mu);
  return {st.status, st.first == 2};
}

}  // namespace tpudist::collectives
