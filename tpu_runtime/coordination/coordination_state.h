// CoordinationState: the job-wide state behind the coordination service,
// free of any RPC machinery so it can be tested directly.
//
// It holds, for one job of `num_tasks` tasks (task ids 0..num_tasks-1):
//   * each task's lifecycle (uninitialized -> connected -> error/disconnected),
//     incarnation and last heartbeat time;
//   * a key-value store with c10d::Store semantics (bytes values; Add keeps an
//     int64 as a decimal string);
//   * barriers: the first arrival of a round fixes the deadline, the round
//     passes when every participant has arrived, else every waiter gets
//     DeadlineExceeded naming the missing task ids;
//   * the job error: the first failure (a missed heartbeat deadline, a task
//     restart, a reported error). Once set, every blocking call (Get, Barrier,
//     PollForError) of every task returns it. Shared fate: it is never cleared.
//
// Blocking calls wait on the one mutex with a deadline (absl::Mutex::
// AwaitWithDeadline); Shutdown() wakes all of them with Cancelled.
//
// Thread-safety: all methods are thread-safe.
#ifndef TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_STATE_H_
#define TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tpudist::tpu_runtime::coordination {

enum class TaskState { kUninitialized, kConnected, kError, kDisconnected };
const char* TaskStateName(TaskState state);

// "{0, 2, 3}", for error messages.
std::string FormatTaskIds(absl::Span<const int> ids);

class CoordinationState {
 public:
  // REQUIRES: num_tasks >= 1, heartbeat_timeout > 0.
  // num_slices: the job's slice count that RegisterTask checks claims
  // against; 0 = not checked.
  CoordinationState(std::string job_id, int num_tasks,
                    absl::Duration heartbeat_timeout, int num_slices = 0);
  CoordinationState(const CoordinationState&) = delete;
  CoordinationState& operator=(const CoordinationState&) = delete;

  const std::string& job_id() const { return job_id_; }
  int num_tasks() const { return num_tasks_; }
  absl::Duration heartbeat_timeout() const { return heartbeat_timeout_; }

  // FailedPrecondition naming both ids when job_id differs from ours;
  // InvalidArgument when task_id is out of range.
  absl::Status ValidateSender(absl::string_view job_id, int task_id) const;

  // Connects `task`. Idempotent for the same incarnation. A connected task
  // registering with a new incarnation restarted: that fails the job. So does
  // a task that claims another world size (`claimed_num_tasks` != 0 and !=
  // num_tasks()), or another slice count (`claimed_num_slices` != 0, the
  // job's num_slices != 0, and they differ; checked first): the job error
  // names both values.
  absl::Status RegisterTask(int task, uint64_t incarnation, absl::Time now,
                            int claimed_num_tasks = 0,
                            int claimed_num_slices = 0);
  // Refreshes the task's heartbeat. Returns an error about the task itself
  // (not registered, stale incarnation, marked failed); the job error is read
  // separately with JobError().
  absl::Status Heartbeat(int task, uint64_t incarnation, absl::Time now);
  // The task leaves cleanly: no longer checked for heartbeats.
  absl::Status ShutdownTask(int task);
  // Records `error` from `task` as the job error (if none yet) and marks the
  // task failed. REQUIRES: !error.ok().
  void ReportError(int task, const absl::Status& error);
  // The task's error watcher was cancelled before its deadline: if the task
  // is still connected with `incarnation`, its process or its channel is
  // gone, and it is failed (Unavailable). Returns whether it was failed.
  bool TaskDisconnected(int task, uint64_t incarnation);
  // Marks every connected task whose last heartbeat is older than the
  // heartbeat timeout as failed; returns the ids newly marked.
  std::vector<int> CheckHeartbeats(absl::Time now);
  // The registration deadline passed (`waited` after the service started):
  // every task that never registered is failed, and the job error
  // (DeadlineExceeded, blamed on the lowest such task) names them all
  // ("rank 1 never registered ..."). Returns the ids failed; empty when
  // every task registered or the job already has an error.
  std::vector<int> FailUnregistered(absl::Duration waited);

  TaskState task_state(int task) const;
  // Blocks until no task is connected (each left, failed or never came), or
  // `deadline`, or Shutdown(). Returns whether no task is connected.
  bool AwaitNoTaskConnected(absl::Time deadline);
  // OkStatus() while the job is healthy.
  absl::Status JobError() const;
  // Task that caused JobError(), -1 when none.
  int JobErrorTask() const;
  // Blocks until the job has an error, Shutdown(), or `deadline`. Returns
  // the job error, Cancelled on shutdown, OkStatus() on deadline.
  absl::Status PollForError(absl::Time deadline);

  // Key-value store. `task` is only used in messages.
  absl::Status Set(int task, absl::string_view key, absl::string_view value,
                   bool allow_overwrite);
  // Blocks until `key` is set; DeadlineExceeded at `deadline`, the job error
  // if one arrives first, Cancelled on Shutdown().
  absl::StatusOr<std::string> Get(int task, absl::string_view key,
                                  absl::Time deadline);
  // NotFound when absent.
  absl::StatusOr<std::string> TryGet(absl::string_view key) const;
  // InvalidArgument when the stored value is not a decimal int64, OutOfRange
  // on overflow.
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta);
  bool Delete(absl::string_view key);
  // c10d::Store::compareSet semantics; see coordination.proto.
  std::string CompareSet(absl::string_view key, absl::string_view expected,
                         absl::string_view desired);
  int64_t NumKeys(absl::string_view prefix) const;
  bool Check(absl::Span<const std::string> keys) const;

  // Waits at barrier `barrier_id` among `tasks` (all tasks when empty).
  // `timeout` fixes the round's deadline if this is its first arrival;
  // `wait_deadline` additionally bounds this call (the RPC deadline).
  absl::Status Barrier(int task, absl::string_view barrier_id,
                       absl::Span<const int> tasks, absl::Duration timeout,
                       absl::Time now, absl::Time wait_deadline);

  // Wakes every blocked call with Cancelled; later blocking calls return
  // Cancelled at once.
  void Shutdown();

 private:
  struct TaskInfo {
    TaskState state = TaskState::kUninitialized;
    uint64_t incarnation = 0;
    absl::Time last_heartbeat = absl::InfinitePast();
  };
  struct BarrierRound {
    std::vector<int> participants;  // sorted, unique
    std::vector<bool> arrived;      // [num_tasks]
    int num_arrived = 0;
    absl::Time deadline;
    bool done = false;
    absl::Status result;
  };

  void FailTaskLocked(int task, absl::Status error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<int> MissingLocked(const BarrierRound& round) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // " (never registered: {1, 3})" for the uninitialized among `ids`, or "".
  std::string NeverRegisteredLocked(absl::Span<const int> ids) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishRoundLocked(BarrierRound& round, absl::Status result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string job_id_;
  const int num_tasks_;
  const int num_slices_;  // 0: not checked
  const absl::Duration heartbeat_timeout_;

  mutable absl::Mutex mu_;
  std::vector<TaskInfo> tasks_ ABSL_GUARDED_BY(mu_);  // [num_tasks]
  std::map<std::string, std::string, std::less<>> kv_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<BarrierRound>> barriers_
      ABSL_GUARDED_BY(mu_);
  absl::Status job_error_ ABSL_GUARDED_BY(mu_);
  int job_error_task_ ABSL_GUARDED_BY(mu_) = -1;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tpudist::tpu_runtime::coordination

#endif  // TPU_DIST_TPU_RUNTIME_COORDINATION_COORDINATION_STATE_H_
