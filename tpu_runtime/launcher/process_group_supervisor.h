// SuperviseProcessGroup: runs one process per rank, relays their output, and
// applies the job's fate-sharing policy: if any rank fails, all ranks stop.
//
// How a job runs:
//   1. The planner is asked for the ranks of attempt `restart_count` (argv,
//      env, labels); the supervisor adds TORCHELASTIC_RESTART_COUNT,
//      TPU_DIST_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS to every env.
//   2. Every rank is started (ChildProcess: own process group, pipes). Its
//      stdout/stderr are read with poll() and written, whole lines only and
//      prefixed with the rank's label, to options.stdout_fd/stderr_fd.
//   3. When a rank exits non-zero or is killed by a signal, it is the
//      attempt's first failure: all other ranks get SIGTERM, and those still
//      alive after grace_period get SIGKILL. A rank that exits with
//      kPeerFailureExitCode (75, tpu_runtime/exit_codes.h) says it stopped
//      because another rank failed: it is not the root cause, so the
//      supervisor waits up to root_cause_wait for a rank that failed for a
//      reason of its own (a signal, any other non-zero code) and reports
//      that one; if none comes, it stops the others and reports the first
//      peer failure, naming the ranks still running (a hung rank shows up
//      there). Such an exit is never a success: an attempt whose ranks all
//      exited, some with kPeerFailureExitCode and none for a reason of its
//      own, failed too (its root cause ran elsewhere, e.g. on another host's
//      tpurun: see peer_failure_hint).
//   3a. Optionally, before that stop, ranks still running are asked (a signal)
//      to write diagnostics and given a bounded wait (ranks_to_wait_for); a
//      hook runs after each failed attempt (after_failed_attempt).
//   4. A failed attempt is followed by a new one (restart_count + 1, fresh
//      planner call: new MASTER_PORT etc.) until max_restarts restarts have
//      been made; then the job fails with the last attempt's first failure.
//   5. SIGINT/SIGTERM/SIGHUP received by the launcher are forwarded to all
//      ranks (a second one escalates to SIGKILL); then as in 3, without a
//      restart. The job-wide `timeout` stops the ranks the same way.
//
// Every wait has a deadline: poll() wakes at least every poll_interval, and a
// rank that survives SIGKILL for reap_timeout makes the call return an error.
//
// Threading: call from one thread. The call blocks SIGINT, SIGTERM, SIGHUP and
// SIGCHLD in the calling thread while it runs (see SignalWatcher); other
// threads of the process should block them too. Writes to a closed output pipe
// raise SIGPIPE: a launcher binary should ignore SIGPIPE.
#ifndef TPU_DIST_TPU_RUNTIME_LAUNCHER_PROCESS_GROUP_SUPERVISOR_H_
#define TPU_DIST_TPU_RUNTIME_LAUNCHER_PROCESS_GROUP_SUPERVISOR_H_

#include <unistd.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tpu_runtime/env_map.h"
#include "tpu_runtime/launcher/exit_status.h"

namespace tpudist::tpu_runtime::launcher {

// One rank to start.
struct ProcessSpec {
  int rank = 0;
  std::string description;        // for reports: "rank 5 (host 1, local 1)"
  std::string output_prefix;      // put before each output line: "[rank  5] "
  std::vector<std::string> argv;  // argv[0] is searched in PATH
  EnvMap env;                     // overlaid on the launcher's environment
};

// Gives the ranks of one attempt; restart_count is 0 for the first attempt.
// Called once per attempt, before any rank of that attempt starts.
using LaunchPlanner = std::function<absl::StatusOr<std::vector<ProcessSpec>>(int restart_count)>;

struct SupervisorOptions {
  absl::Duration grace_period = absl::Seconds(5);  // SIGTERM -> SIGKILL
  int max_restarts = 0;
  absl::Duration timeout = absl::InfiniteDuration();  // whole job, all attempts
  int stdout_fd = STDOUT_FILENO;                      // where ranks' prefixed stdout lines go
  int stderr_fd = STDERR_FILENO;                      // ranks' stderr lines and our own messages
  std::string log_prefix = "tpurun: ";                // before the supervisor's own messages
  absl::Duration poll_interval = absl::Milliseconds(100);
  // After a rank exits, how long its pipes may stay open (held by something
  // it spawned) before that leftover process group is SIGKILLed.
  absl::Duration drain_timeout = absl::Seconds(2);
  // After SIGKILL, how long a rank may take to be reaped before we give up.
  absl::Duration reap_timeout = absl::Seconds(10);
  absl::Duration exec_timeout = absl::Seconds(10);  // per rank, see ChildProcess
  // After a rank exits with kPeerFailureExitCode, how long to wait for the
  // root cause (see 3 above) before stopping the others.
  absl::Duration root_cause_wait = absl::Seconds(3);
  // Added to the report of an attempt that failed only through ranks that
  // exited with kPeerFailureExitCode: where the root cause may be instead,
  // e.g. "the rank that failed is on another host: see the tpurun of host 1
  // (h1)". Empty: nothing added.
  std::string peer_failure_hint;
  // Before the stop that follows a rank's failure (3 above; not a signal or
  // the job timeout): when set, it is asked which of the ranks still running
  // to wait for (tpurun: those that have not written a flight-recorder dump
  // yet). Those get `before_stop_signal` (0: none; tpurun: SIGUSR1, "dump
  // now") once, and the stop waits, relaying output, until it returns none
  // of them or `before_stop_wait` has passed.
  std::function<std::vector<int>(const std::vector<int>& running_ranks)> ranks_to_wait_for;
  int before_stop_signal = 0;
  absl::Duration before_stop_wait = absl::Seconds(2);
  // Called after every attempt that failed (a rank failure or the job
  // timeout), once all its ranks have exited and before a restart or the
  // return (tpurun: prints the flight recorder's verdict).
  std::function<void(int restart_count)> after_failed_attempt;
  // After a failed attempt's ranks have all stopped, before
  // after_failed_attempt: given RankFailure::failed_on_their_own (never
  // empty), the lines to log about them (tpurun: the slices whose ranks all
  // failed, "slice 1 (ranks 8-15, ...) lost: ..."). Unset: nothing logged.
  std::function<std::vector<std::string>(const std::vector<int>& failed_ranks)>
      describe_failed_ranks;
  // After a rank's own failure, how long the other ranks keep running (their
  // output relayed, their exits reaped) before the stop: ranks that die on
  // their own in that window (the rest of a lost slice) count in
  // RankFailure::failed_on_their_own instead of being stopped by us.
  // tpurun: 300 ms for a job of several slices, else 0.
  absl::Duration failure_settle_time = absl::ZeroDuration();
};

// The first rank of an attempt to fail, and how.
struct RankFailure {
  int rank = 0;
  std::string description;
  ExitStatus status;
  absl::Duration after;  // since the attempt started
  // The rank exited with kPeerFailureExitCode and no rank failed for a
  // reason of its own: the root cause is unknown (see still_running).
  bool peer_failure = false;
  // Ranks that had not exited when the supervisor began stopping the job.
  std::vector<int> still_running;
  // Ranks that exited with kPeerFailureExitCode before the stop began, sorted.
  std::vector<int> followed_by;
  // peer_failure: the rank's last stderr line (what it was told about the
  // failure, e.g. the job error naming the failed task), at most ~512 bytes.
  std::string last_stderr_line;
  // peer_failure: SupervisorOptions::peer_failure_hint.
  std::string hint;
  // Every rank of the attempt that failed for a reason of its own (a signal
  // or a non-zero code other than kPeerFailureExitCode) before the
  // supervisor stopped it, or was SIGKILLed by someone else during the
  // SIGTERM grace period; sorted. Includes `rank` unless peer_failure.
  std::vector<int> failed_on_their_own;
};

struct ExitReport {
  enum class Outcome { kSucceeded, kRankFailed, kTimedOut, kInterrupted };
  Outcome outcome = Outcome::kSucceeded;
  int restarts = 0;  // restarts made (attempts - 1)
  // The last attempt's first failure. Set for kRankFailed; may be set for
  // kTimedOut / kInterrupted when a rank had failed before that.
  std::optional<RankFailure> first_failure;
  int signal = 0;                 // kInterrupted: the signal the launcher received
  std::vector<ExitStatus> exits;  // last attempt, index = position in plan
  absl::Duration elapsed;         // whole job

  bool success() const { return outcome == Outcome::kSucceeded; }
  // 0 on success; the failing rank's ShellCode() for kRankFailed (75 when
  // only followers failed); 124 for kTimedOut; 128 + signal for
  // kInterrupted. kSucceeded only when every rank of the last attempt
  // exited 0.
  int ExitCode() const;
  // One line: "rank 5 (host 1, local 1) failed: killed by signal SIGKILL
  // (after 2 restarts)", "all 16 ranks succeeded in 1.2s", ...
  std::string Summary() const;
};

// Runs the job as described at the top of this file. Returns an error (not an
// ExitReport) only when the supervisor itself could not do its job: the
// planner failed, a binary could not be executed, a rank could not be reaped.
absl::StatusOr<ExitReport> SuperviseProcessGroup(const LaunchPlanner& planner,
                                                 const SupervisorOptions& options);

}  // namespace tpudist::tpu_runtime::launcher

#endif  // TPU_DIST_TPU_RUNTIME_LAUNCHER_PROCESS_GROUP_SUPERVISOR_H_
