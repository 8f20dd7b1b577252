#include "tpu_runtime/coordination/coordination_state.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tpudist::tpu_runtime::coordination {

const char* TaskStateName(TaskState state) {
  switch (state) {
    case TaskState::kUninitialized:
      return "uninitialized";
    case TaskState::kConnected:
      return "connected";
    case TaskState::kError:
      return "error";
    case TaskState::kDisconnected:
      return "disconnected";
  }
  return "unknown";
}

std::string FormatTaskIds(absl::Span<const int> ids) {
  return absl::StrCat("{", absl::StrJoin(ids, ", "), "}");
}

CoordinationState::CoordinationState(std::string job_id, int num_tasks,
                                     absl::Duration heartbeat_timeout,
                                     int num_slices)
    : job_id_(std::move(job_id)),
      num_tasks_(num_tasks),
      num_slices_(num_slices),
      heartbeat_timeout_(heartbeat_timeout),
      tasks_(num_tasks) {}

absl::Status CoordinationState::ValidateSender(absl::string_view job_id,
                                               int task_id) const {
  if (job_id != job_id_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "task %d belongs to job '%s' but this coordination service serves "
        "job '%s'",
        task_id, job_id, job_id_));
  }
  if (task_id < 0 || task_id >= num_tasks_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("task id %d out of range [0, %d) for job '%s'", task_id,
                        num_tasks_, job_id_));
  }
  return absl::OkStatus();
}

void CoordinationState::FailTaskLocked(int task, absl::Status error) {
  tasks_[task].state = TaskState::kError;
  if (job_error_.ok()) {
    job_error_ = std::move(error);
    job_error_task_ = task;
  }
}

absl::Status CoordinationState::RegisterTask(int task, uint64_t incarnation,
                                             absl::Time now,
                                             int claimed_num_tasks,
                                             int claimed_num_slices) {
  absl::MutexLock lock(&mu_);
  TaskInfo& info = tasks_[task];
  if (claimed_num_slices != 0 && num_slices_ != 0 &&
      claimed_num_slices != num_slices_) {
    FailTaskLocked(
        task, absl::FailedPreconditionError(absl::StrFormat(
                  "task %d of job '%s' was started for %d slices "
                  "(MEGASCALE_NUM_SLICES=%d), but the job's coordination "
                  "service (hosted by task 0) was started for %d slices: a "
                  "stale slice count (e.g. after a slice was replaced); "
                  "every rank must get the live count",
                  task, job_id_, claimed_num_slices, claimed_num_slices,
                  num_slices_)));
    return job_error_;
  }
  if (claimed_num_tasks != 0 && claimed_num_tasks != num_tasks_) {
    FailTaskLocked(
        task, absl::FailedPreconditionError(absl::StrFormat(
                  "task %d of job '%s' was started with world size %d, but "
                  "the job's coordination service (hosted by task 0) was "
                  "started with world size %d: every rank must get the same "
                  "WORLD_SIZE / topology",
                  task, job_id_, claimed_num_tasks, num_tasks_)));
    return job_error_;
  }
  switch (info.state) {
    case TaskState::kConnected:
      if (info.incarnation == incarnation) break;  // a retried RegisterTask
      FailTaskLocked(task,
                     absl::AbortedError(absl::StrFormat(
                         "task %d of job '%s' restarted (incarnation %x -> %x)",
                         task, job_id_, info.incarnation, incarnation)));
      return job_error_;
    case TaskState::kError:
      return absl::FailedPreconditionError(
          absl::StrFormat("task %d of job '%s' is marked failed; job error: %s",
                          task, job_id_, job_error_.ToString()));
    case TaskState::kUninitialized:
    case TaskState::kDisconnected:
      break;
  }
  info.state = TaskState::kConnected;
  info.incarnation = incarnation;
  info.last_heartbeat = now;
  return absl::OkStatus();
}

absl::Status CoordinationState::Heartbeat(int task, uint64_t incarnation,
                                          absl::Time now) {
  absl::MutexLock lock(&mu_);
  TaskInfo& info = tasks_[task];
  if (info.state != TaskState::kConnected) {
    return absl::FailedPreconditionError(
        absl::StrFormat("heartbeat from task %d of job '%s' in state %s", task,
                        job_id_, TaskStateName(info.state)));
  }
  if (info.incarnation != incarnation) {
    return absl::AbortedError(absl::StrFormat(
        "heartbeat from task %d with incarnation %x, registered %x", task,
        incarnation, info.incarnation));
  }
  info.last_heartbeat = now;
  return absl::OkStatus();
}

absl::Status CoordinationState::ShutdownTask(int task) {
  absl::MutexLock lock(&mu_);
  if (tasks_[task].state == TaskState::kConnected) {
    tasks_[task].state = TaskState::kDisconnected;
  }
  return absl::OkStatus();
}

void CoordinationState::ReportError(int task, const absl::Status& error) {
  absl::MutexLock lock(&mu_);
  FailTaskLocked(
      task,
      absl::Status(error.code(),
                   absl::StrFormat("task %d of job '%s' reported an error: %s",
                                   task, job_id_, error.message())));
}

bool CoordinationState::TaskDisconnected(int task, uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  TaskInfo& info = tasks_[task];
  if (info.state != TaskState::kConnected || info.incarnation != incarnation) {
    return false;
  }
  FailTaskLocked(task, absl::UnavailableError(absl::StrFormat(
                           "task %d of job '%s' lost its connection to the "
                           "coordination service without shutting down (its "
                           "process exited or was killed, or its network "
                           "failed)",
                           task, job_id_)));
  return true;
}

std::vector<int> CoordinationState::CheckHeartbeats(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<int> failed;
  for (int t = 0; t < num_tasks_; ++t) {
    TaskInfo& info = tasks_[t];
    if (info.state != TaskState::kConnected) continue;
    const absl::Duration silent = now - info.last_heartbeat;
    if (silent <= heartbeat_timeout_) continue;
    FailTaskLocked(t, absl::UnavailableError(absl::StrFormat(
                          "task %d of job '%s' missed its heartbeat deadline: "
                          "no heartbeat for "
                          "%s (timeout %s)",
                          t, job_id_, absl::FormatDuration(silent),
                          absl::FormatDuration(heartbeat_timeout_))));
    failed.push_back(t);
  }
  return failed;
}

std::vector<int> CoordinationState::FailUnregistered(absl::Duration waited) {
  absl::MutexLock lock(&mu_);
  std::vector<int> missing;
  if (!job_error_.ok() || shutdown_) return missing;
  for (int t = 0; t < num_tasks_; ++t) {
    if (tasks_[t].state == TaskState::kUninitialized) missing.push_back(t);
  }
  if (missing.empty()) return missing;
  const std::string who =
      missing.size() == 1
          ? absl::StrCat("rank ", missing[0])
          : absl::StrCat("ranks ", absl::StrJoin(missing, ", "));
  const bool one = missing.size() == 1;
  const absl::Status error = absl::DeadlineExceededError(absl::StrFormat(
      "%s never registered with the coordination service of job '%s' "
      "within %s of its start (the registration timeout; set "
      "TPU_DIST_REGISTRATION_TIMEOUT to wait longer): %s not start, "
      "crashed or hung before connecting (the launcher's log has %s pid and "
      "output); %d of %d ranks registered",
      who, job_id_, absl::FormatDuration(waited),
      one ? "its process did" : "their processes did", one ? "its" : "their",
      num_tasks_ - static_cast<int>(missing.size()), num_tasks_));
  for (int t : missing) FailTaskLocked(t, error);
  return missing;
}

TaskState CoordinationState::task_state(int task) const {
  absl::MutexLock lock(&mu_);
  return tasks_[task].state;
}

bool CoordinationState::AwaitNoTaskConnected(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const TaskInfo& info : tasks_) {
      if (info.state == TaskState::kConnected) return false;
    }
    return true;
  };
  auto ready = [this, &none]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutdown_ || none();
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  return none();
}

absl::Status CoordinationState::JobError() const {
  absl::MutexLock lock(&mu_);
  return job_error_;
}

int CoordinationState::JobErrorTask() const {
  absl::MutexLock lock(&mu_);
  return job_error_task_;
}

absl::Status CoordinationState::PollForError(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !job_error_.ok() || shutdown_;
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (!job_error_.ok()) return job_error_;
  if (shutdown_) {
    return absl::CancelledError("coordination service shutting down");
  }
  return absl::OkStatus();
}

void CoordinationState::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

// ---- key-value store ------------------------------------------------------

absl::Status CoordinationState::Set(int task, absl::string_view key,
                                    absl::string_view value,
                                    bool allow_overwrite) {
  absl::MutexLock lock(&mu_);
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    kv_.emplace(std::string(key), std::string(value));
  } else if (allow_overwrite) {
    it->second.assign(value.data(), value.size());
  } else {
    return absl::AlreadyExistsError(absl::StrFormat(
        "Set('%s') by task %d: key exists and allow_overwrite is false", key,
        task));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CoordinationState::Get(int task,
                                                   absl::string_view key,
                                                   absl::Time deadline) {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  auto ready = [this, key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutdown_ || !job_error_.ok() || kv_.find(key) != kv_.end();
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (shutdown_) {
    return absl::CancelledError("coordination service shutting down");
  }
  if (!job_error_.ok()) return job_error_;
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    return absl::DeadlineExceededError(
        absl::StrFormat("Get('%s') by task %d: key not set after %s", key, task,
                        absl::FormatDuration(absl::Now() - start)));
  }
  return it->second;
}

absl::StatusOr<std::string> CoordinationState::TryGet(
    absl::string_view key) const {
  absl::MutexLock lock(&mu_);
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    return absl::NotFoundError(absl::StrCat("key '", key, "' not set"));
  }
  return it->second;
}

absl::StatusOr<int64_t> CoordinationState::Add(absl::string_view key,
                                               int64_t delta) {
  absl::MutexLock lock(&mu_);
  auto it = kv_.find(key);
  int64_t current = 0;
  if (it != kv_.end() && !absl::SimpleAtoi(it->second, &current)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Add('%s'): stored value '%s' is not a decimal int64",
                        key, absl::CHexEscape(it->second.substr(0, 32))));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(current, delta, &sum)) {
    return absl::OutOfRangeError(absl::StrFormat(
        "Add('%s'): %d + %d overflows int64", key, current, delta));
  }
  if (it == kv_.end()) {
    kv_.emplace(std::string(key), absl::StrCat(sum));
  } else {
    it->second = absl::StrCat(sum);
  }
  return sum;
}

bool CoordinationState::Delete(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = kv_.find(key);
  if (it == kv_.end()) return false;
  kv_.erase(it);
  return true;
}

std::string CoordinationState::CompareSet(absl::string_view key,
                                          absl::string_view expected,
                                          absl::string_view desired) {
  absl::MutexLock lock(&mu_);
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    if (!expected.empty()) return std::string(expected);
    kv_.emplace(std::string(key), std::string(desired));
    return std::string(desired);
  }
  if (it->second == expected) it->second.assign(desired.data(), desired.size());
  return it->second;
}

int64_t CoordinationState::NumKeys(absl::string_view prefix) const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (auto it = kv_.lower_bound(prefix);
       it != kv_.end() && absl::StartsWith(it->first, prefix); ++it) {
    ++n;
  }
  return n;
}

bool CoordinationState::Check(absl::Span<const std::string> keys) const {
  absl::MutexLock lock(&mu_);
  for (const std::string& key : keys) {
    if (kv_.find(key) == kv_.end()) return false;
  }
  return true;
}

// ---- barriers -------------------------------------------------------------
//
// A barrier id names a sequence of rounds. A round is created by the first
// arrival after the previous round ended and every participant of it has
// seen the result (a late task still gets the previous round's error), or by
// a participant arriving again after it already saw the result (a retry).

std::vector<int> CoordinationState::MissingLocked(
    const BarrierRound& round) const {
  std::vector<int> missing;
  for (int t : round.participants) {
    if (!round.arrived[t]) missing.push_back(t);
  }
  return missing;
}

std::string CoordinationState::NeverRegisteredLocked(
    absl::Span<const int> ids) const {
  std::vector<int> never;
  for (int t : ids) {
    if (tasks_[t].state == TaskState::kUninitialized) never.push_back(t);
  }
  if (never.empty()) return "";
  return absl::StrCat(" (never registered: ", FormatTaskIds(never), ")");
}

void CoordinationState::FinishRoundLocked(BarrierRound& round,
                                          absl::Status result) {
  if (round.done) return;
  round.done = true;
  round.result = std::move(result);
}

absl::Status CoordinationState::Barrier(int task, absl::string_view barrier_id,
                                        absl::Span<const int> tasks,
                                        absl::Duration timeout, absl::Time now,
                                        absl::Time wait_deadline) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Barrier('%s') by task %d: timeout must be positive",
                        barrier_id, task));
  }
  std::vector<int> participants(tasks.begin(), tasks.end());
  if (participants.empty()) {
    for (int t = 0; t < num_tasks_; ++t) participants.push_back(t);
  }
  std::sort(participants.begin(), participants.end());
  participants.erase(std::unique(participants.begin(), participants.end()),
                     participants.end());
  for (int t : participants) {
    if (t < 0 || t >= num_tasks_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "Barrier('%s') by task %d: task id %d out of range [0, %d)",
          barrier_id, task, t, num_tasks_));
    }
  }
  if (!std::binary_search(participants.begin(), participants.end(), task)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Barrier('%s'): caller task %d is not among its tasks %s", barrier_id,
        task, FormatTaskIds(participants)));
  }

  absl::MutexLock lock(&mu_);
  if (shutdown_)
    return absl::CancelledError("coordination service shutting down");
  if (!job_error_.ok()) return job_error_;
  std::shared_ptr<BarrierRound>& slot = barriers_[std::string(barrier_id)];
  if (slot != nullptr && slot->done) {
    const bool everyone_saw =
        slot->num_arrived == static_cast<int>(slot->participants.size());
    if (!everyone_saw && !slot->arrived[task] &&
        slot->participants == participants) {
      slot->arrived[task] = true;  // late arrival to a failed round
      ++slot->num_arrived;
      return slot->result;
    }
    slot = nullptr;
  }
  if (slot == nullptr) {
    slot = std::make_shared<BarrierRound>();
    slot->participants = participants;
    slot->arrived.assign(num_tasks_, false);
    slot->deadline = now + timeout;
  } else if (slot->participants != participants) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Barrier('%s') by task %d with tasks %s, but its current round has "
        "tasks %s",
        barrier_id, task, FormatTaskIds(participants),
        FormatTaskIds(slot->participants)));
  }
  std::shared_ptr<BarrierRound> round = slot;  // keep alive while waiting
  if (!round->arrived[task]) {
    round->arrived[task] = true;
    ++round->num_arrived;
  }
  if (round->num_arrived == static_cast<int>(round->participants.size())) {
    FinishRoundLocked(*round, absl::OkStatus());
    return round->result;
  }

  // A missing participant that left cleanly will never come.
  auto departed = [this, &round]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int t : round->participants) {
      if (!round->arrived[t] && tasks_[t].state == TaskState::kDisconnected) {
        return t;
      }
    }
    return -1;
  };
  auto ready = [this, &round, &departed]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return round->done || shutdown_ || !job_error_.ok() || departed() >= 0;
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready),
                        std::min(round->deadline, wait_deadline));
  if (!round->done) {
    if (!job_error_.ok()) {
      FinishRoundLocked(*round, job_error_);
    } else if (shutdown_) {
      return absl::CancelledError("coordination service shutting down");
    } else if (const int gone = departed(); gone >= 0) {
      FinishRoundLocked(
          *round, absl::FailedPreconditionError(absl::StrFormat(
                      "Barrier('%s'): task %d shut down before arriving; "
                      "missing tasks %s",
                      barrier_id, gone, FormatTaskIds(MissingLocked(*round)))));
    } else if (absl::Now() >= round->deadline) {
      FinishRoundLocked(*round,
                        absl::DeadlineExceededError(absl::StrFormat(
                            "Barrier('%s') of job '%s' timed out after %s: "
                            "%d/%d tasks arrived, "
                            "missing tasks %s%s",
                            barrier_id, job_id_, absl::FormatDuration(timeout),
                            round->num_arrived, round->participants.size(),
                            FormatTaskIds(MissingLocked(*round)),
                            NeverRegisteredLocked(MissingLocked(*round)))));
    } else {
      return absl::DeadlineExceededError(absl::StrFormat(
          "Barrier('%s') by task %d: RPC deadline passed before the barrier "
          "deadline; missing tasks %s",
          barrier_id, task, FormatTaskIds(MissingLocked(*round))));
    }
  }
  return round->result;
}

}  // namespace tpudist::tpu_runtime::coordination
