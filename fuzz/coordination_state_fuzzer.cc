// Fuzz target: tpu_runtime/coordination/coordination_state.h, the job state
// behind every coordination-service RPC.
//
// Input: a job size, then a sequence of requests, each an op byte, a sender
// (job id and task id, possibly out of range) and the op's fields (keys,
// values, incarnations, barrier participants and timeouts, error codes, clock
// advances). Requests are handled as coordination_service.cc handles them:
// ValidateSender first, then the CoordinationState call. Single-threaded and
// deterministic: every blocking call gets a deadline already in the past.
//
// Checked after every request:
//   * ValidateSender accepts exactly this job's ids 0..num_tasks-1;
//   * the key-value store agrees with a std::map model of c10d::Store
//     semantics (Set / Get / TryGet / Add / Delete / CompareSet / NumKeys /
//     Check);
//   * the job error, once set, never changes (shared fate), names a task in
//     range, and every blocking call returns it (or Cancelled after Shutdown);
//   * CheckHeartbeats marks only connected tasks, each once, as failed.
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"
#include "tpu_runtime/coordination/coordination_state.h"

namespace {

namespace coord = tpudist::tpu_runtime::coordination;
using tpudist::fuzz::FuzzInput;

constexpr char kJob[] = "job";
constexpr int kMaxTasks = 8;
constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(10);

enum Op {
  kRegister, kHeartbeat, kAdvanceClock, kShutdownTask, kReportError, kDisconnected,
  kSet, kGet, kTryGet, kAdd, kDelete, kCompareSet, kNumKeys, kCheck, kBarrier, kPoll,
  kNumOps
};

// Mostly a handful of short keys (so that requests meet), sometimes any bytes.
std::string Key(FuzzInput& in) {
  const uint8_t b = in.Byte();
  if (b < 224) return absl::StrCat("k", b % 6);
  return in.String(24);
}

class Harness {
 public:
  explicit Harness(int num_tasks) : num_tasks_(num_tasks), state_(kJob, num_tasks, kHeartbeatTimeout) {}

  void Handle(FuzzInput& in) {
    const int op = in.Byte() % kNumOps;
    const bool foreign = in.Byte() % 16 == 0;
    const int task = static_cast<int>(in.IntInRange(-1, num_tasks_));
    const absl::Status valid = state_.ValidateSender(foreign ? "other-job" : kJob, task);
    FUZZ_CHECK(valid.ok() == (!foreign && task >= 0 && task < num_tasks_), "ValidateSender(%d): %s", task,
               valid.ToString().c_str());
    if (!valid.ok()) return;
    switch (op) {
      case kRegister: {
        const uint64_t incarnation = in.Byte() % 4;
        const int claimed = in.Byte() % 8 == 0 ? static_cast<int>(in.IntInRange(0, kMaxTasks)) : 0;
        (void)state_.RegisterTask(task, incarnation, clock_, claimed);
        break;
      }
      case kHeartbeat:
        (void)state_.Heartbeat(task, in.Byte() % 4, clock_);
        break;
      case kAdvanceClock: {
        clock_ += absl::Seconds(in.IntInRange(0, 15));
        std::vector<coord::TaskState> before;
        for (int t = 0; t < num_tasks_; ++t) before.push_back(state_.task_state(t));
        std::vector<bool> seen(num_tasks_, false);
        for (int t : state_.CheckHeartbeats(clock_)) {
          FUZZ_CHECK(t >= 0 && t < num_tasks_ && !seen[t], "CheckHeartbeats returned task %d", t);
          seen[t] = true;
          FUZZ_CHECK(before[t] == coord::TaskState::kConnected && state_.task_state(t) == coord::TaskState::kError,
                     "task %d failed by CheckHeartbeats from state %s", t, coord::TaskStateName(before[t]));
        }
        break;
      }
      case kShutdownTask:
        FUZZ_CHECK(state_.ShutdownTask(task).ok(), "ShutdownTask(%d)", task);
        break;
      case kReportError: {
        const auto code = static_cast<absl::StatusCode>(in.IntInRange(1, 16));
        state_.ReportError(task, absl::Status(code, in.String(32)));
        FUZZ_CHECK(state_.task_state(task) == coord::TaskState::kError, "reporting task %d not failed", task);
        break;
      }
      case kDisconnected:
        (void)state_.TaskDisconnected(task, in.Byte() % 4);
        break;
      case kSet: {
        const std::string key = Key(in), value = in.String(16);
        const bool overwrite = in.Bool();
        const bool exists = kv_.count(key) != 0;
        const absl::Status st = state_.Set(task, key, value, overwrite);
        if (exists && !overwrite) {
          FUZZ_CHECK(absl::IsAlreadyExists(st), "Set over an existing key: %s", st.ToString().c_str());
        } else {
          FUZZ_CHECK(st.ok(), "Set: %s", st.ToString().c_str());
          kv_[key] = value;
        }
        break;
      }
      case kGet: {
        const std::string key = Key(in);
        absl::StatusOr<std::string> got = state_.Get(task, key, absl::InfinitePast());
        if (shutdown_) {
          FUZZ_CHECK(absl::IsCancelled(got.status()), "Get after Shutdown: %s", got.status().ToString().c_str());
        } else if (job_error_) {
          FUZZ_CHECK(got.status() == *job_error_, "Get with a job error: %s", got.status().ToString().c_str());
        } else if (kv_.count(key) != 0) {
          FUZZ_CHECK(got.ok() && *got == kv_[key], "Get of a set key: %s", got.status().ToString().c_str());
        } else {
          FUZZ_CHECK(absl::IsDeadlineExceeded(got.status()), "Get of an unset key: %s",
                     got.status().ToString().c_str());
        }
        break;
      }
      case kTryGet: {
        const std::string key = Key(in);
        absl::StatusOr<std::string> got = state_.TryGet(key);
        if (kv_.count(key) != 0) {
          FUZZ_CHECK(got.ok() && *got == kv_[key], "TryGet of a set key");
        } else {
          FUZZ_CHECK(absl::IsNotFound(got.status()), "TryGet of an unset key: %s", got.status().ToString().c_str());
        }
        break;
      }
      case kAdd: {
        const std::string key = Key(in);
        const int64_t delta = in.Bool() ? in.IntInRange(-3, 3) : static_cast<int64_t>(in.U64());
        absl::StatusOr<int64_t> sum = state_.Add(key, delta);
        int64_t current = 0;
        auto it = kv_.find(key);
        int64_t want = 0;
        if (it != kv_.end() && !absl::SimpleAtoi(it->second, &current)) {
          FUZZ_CHECK(absl::IsInvalidArgument(sum.status()), "Add to '%s'", it->second.c_str());
        } else if (__builtin_add_overflow(current, delta, &want)) {
          FUZZ_CHECK(absl::IsOutOfRange(sum.status()), "Add overflow: %s", sum.status().ToString().c_str());
        } else {
          FUZZ_CHECK(sum.ok() && *sum == want, "Add: %s", sum.status().ToString().c_str());
          kv_[key] = absl::StrCat(want);
        }
        break;
      }
      case kDelete: {
        const std::string key = Key(in);
        FUZZ_CHECK(state_.Delete(key) == (kv_.erase(key) != 0), "Delete");
        break;
      }
      case kCompareSet: {
        const std::string key = Key(in);
        const std::string expected = in.Bool() ? std::string() : in.String(8);
        const std::string desired = in.String(8);
        const std::string got = state_.CompareSet(key, expected, desired);
        auto it = kv_.find(key);
        std::string want;
        if (it == kv_.end()) {
          want = expected.empty() ? desired : expected;
          if (expected.empty()) kv_[key] = desired;
        } else {
          if (it->second == expected) it->second = desired;
          want = it->second;
        }
        FUZZ_CHECK(got == want, "CompareSet returned the wrong value");
        break;
      }
      case kNumKeys: {
        const std::string prefix = in.Bool() ? "k" : in.String(4);
        int64_t want = 0;
        for (const auto& [k, v] : kv_) want += absl::StartsWith(k, prefix) ? 1 : 0;
        FUZZ_CHECK(state_.NumKeys(prefix) == want, "NumKeys");
        break;
      }
      case kCheck: {
        std::vector<std::string> keys;
        bool want = true;
        for (int n = in.Byte() % 4; n > 0; --n) {
          keys.push_back(Key(in));
          want = want && kv_.count(keys.back()) != 0;
        }
        FUZZ_CHECK(state_.Check(keys) == want, "Check");
        break;
      }
      case kBarrier: {
        const std::string id = absl::StrCat("b", in.Byte() % 3);
        std::vector<int> tasks;
        for (int n = in.Byte() % 4; n > 0; --n) tasks.push_back(static_cast<int>(in.IntInRange(-1, num_tasks_)));
        // Milliseconds as the RPC carries them; 0 and negative are rejected.
        const int64_t timeout_ms = in.Bool() ? in.IntInRange(-1, 2) : 3600 * 1000;
        const absl::Status st = state_.Barrier(task, id, tasks, absl::Milliseconds(timeout_ms), absl::Now(),
                                               absl::InfinitePast());
        if (shutdown_) {
          FUZZ_CHECK(absl::IsCancelled(st) || absl::IsInvalidArgument(st), "Barrier after Shutdown: %s",
                     st.ToString().c_str());
        }
        break;
      }
      case kPoll: {
        if (in.Byte() % 16 == 0) {
          state_.Shutdown();
          shutdown_ = true;
        }
        const absl::Status st = state_.PollForError(absl::InfinitePast());
        if (job_error_) {
          FUZZ_CHECK(st == *job_error_, "PollForError: %s", st.ToString().c_str());
        } else {
          FUZZ_CHECK(shutdown_ ? absl::IsCancelled(st) : st.ok(), "PollForError: %s", st.ToString().c_str());
        }
        FUZZ_CHECK(state_.AwaitNoTaskConnected(absl::InfinitePast()) == NoneConnected(), "AwaitNoTaskConnected");
        break;
      }
    }
    CheckJobError();
  }

 private:
  bool NoneConnected() const {
    for (int t = 0; t < num_tasks_; ++t) {
      if (state_.task_state(t) == coord::TaskState::kConnected) return false;
    }
    return true;
  }

  // Shared fate: the first job error stays, with its task.
  void CheckJobError() {
    const absl::Status error = state_.JobError();
    const int error_task = state_.JobErrorTask();
    if (job_error_) {
      FUZZ_CHECK(error == *job_error_ && error_task == job_error_task_, "job error changed from '%s' to '%s'",
                 job_error_->ToString().c_str(), error.ToString().c_str());
      return;
    }
    if (error.ok()) {
      FUZZ_CHECK(error_task == -1, "no job error, but JobErrorTask() is %d", error_task);
      return;
    }
    FUZZ_CHECK(error_task >= 0 && error_task < num_tasks_, "job error from task %d", error_task);
    FUZZ_CHECK(state_.task_state(error_task) == coord::TaskState::kError, "the failing task %d is not failed",
               error_task);
    job_error_ = error;
    job_error_task_ = error_task;
  }

  const int num_tasks_;
  coord::CoordinationState state_;
  absl::Time clock_ = absl::FromUnixSeconds(1700000000);
  std::map<std::string, std::string> kv_;  // the model
  std::optional<absl::Status> job_error_;
  int job_error_task_ = -1;
  bool shutdown_ = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  Harness harness(1 + in.Byte() % kMaxTasks);
  // Bounded work per input: each request reads at least two bytes.
  while (!in.empty()) harness.Handle(in);
  return 0;
}
