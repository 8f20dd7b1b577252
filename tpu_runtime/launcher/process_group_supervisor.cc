#include "tpu_runtime/launcher/process_group_supervisor.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "tpu_runtime/exit_codes.h"
#include "tpu_runtime/launcher/child_process.h"
#include "tpu_runtime/launcher/line_prefixer.h"
#include "tpu_runtime/launcher/signal_watcher.h"

namespace tpudist::tpu_runtime::launcher {
namespace {

void WriteAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // output gone: drop it, the job goes on
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

// One started rank and its two output streams.
struct Rank {
  const ProcessSpec* spec;
  std::unique_ptr<ChildProcess> child;
  LinePrefixer out, err;
  absl::Time exited_at = absl::InfiniteFuture();
  bool group_killed = false;  // leftovers SIGKILLed after drain_timeout
  std::string last_stderr_line;  // without the prefix and the '\n'
};

// The last line of `lines` (whole prefixed lines, each ending in '\n'),
// without `prefix` and the '\n', cut to a few hundred bytes.
std::string LastLine(absl::string_view lines, absl::string_view prefix) {
  constexpr size_t kMaxKept = 512;
  if (lines.empty()) return "";
  lines.remove_suffix(1);
  const size_t start = lines.rfind('\n');
  if (start != absl::string_view::npos) lines.remove_prefix(start + 1);
  absl::ConsumePrefix(&lines, prefix);
  if (lines.size() <= kMaxKept) return std::string(lines);
  return absl::StrCat(lines.substr(0, kMaxKept), "...");
}

struct AttemptResult {
  ExitReport::Outcome outcome = ExitReport::Outcome::kSucceeded;
  std::optional<RankFailure> first_failure;
  int signal = 0;
  std::vector<ExitStatus> exits;
};

// Runs one attempt: start, relay, stop on the first failure / signal / timeout.
class Attempt {
 public:
  Attempt(const SupervisorOptions& options, SignalWatcher* signals, absl::Time job_deadline)
      : options_(options), signals_(signals), job_deadline_(job_deadline) {}

  absl::StatusOr<AttemptResult> Run(const std::vector<ProcessSpec>& specs);

 private:
  // Whether `status`, reaped now, is a failure of the rank's own: not a
  // success, not kPeerFailureExitCode, and not what the stop sent (a rank
  // reaped before the stop began, or SIGKILLed while the stop had sent only
  // SIGTERM: someone else killed it).
  bool OwnFailure(const ExitStatus& status, bool stop_sent) const {
    if (status.success()) return false;
    if (status.kind == ExitStatus::Kind::kExited && status.code == kPeerFailureExitCode) return false;
    if (!stop_sent) return true;
    return !killed_ && status.kind == ExitStatus::Kind::kSignaled && status.signal == SIGKILL;
  }

  void Log(absl::string_view message) {
    WriteAll(options_.stderr_fd, absl::StrCat(options_.log_prefix, message, "\n"));
  }
  // Starts stopping every rank still running: `signal` now, SIGKILL after the
  // grace period. Idempotent; a later call only escalates.
  void BeginStop(int signal, absl::Time now);
  void ReadStream(Rank& rank, bool is_stdout);
  void HandleSignals(absl::Time now);
  void ReapAndCheck(absl::Time now);
  bool Finished() const;
  bool AllExited() const;
  // After SIGKILL: reaps every rank, waiting at most reap_timeout in total.
  void ReapAllBounded();

  const SupervisorOptions& options_;
  SignalWatcher* signals_;
  absl::Time job_deadline_;
  absl::Time start_;
  std::vector<Rank> ranks_;
  AttemptResult result_;
  bool stopping_ = false;
  absl::Time kill_at_ = absl::InfiniteFuture();
  bool killed_ = false;
  absl::Time give_up_at_ = absl::InfiniteFuture();
  // Ranks that exited with kPeerFailureExitCode, in order; while no root
  // cause is known, the stop begins at root_cause_deadline_.
  std::vector<RankFailure> peer_failures_;
  std::vector<int> failed_on_their_own_;  // in the order reaped
  absl::Time settle_until_ = absl::InfinitePast();  // first failure + failure_settle_time
  absl::Time root_cause_deadline_ = absl::InfiniteFuture();
  // Records the attempt's failure, names the followers, and begins the stop
  // (after the before-stop wait, when options_.ranks_to_wait_for is set).
  void FailAttempt(RankFailure failure, absl::Time now);
  std::vector<int> RunningRanks() const;
  // The before-stop wait (SupervisorOptions::ranks_to_wait_for): until
  // before_stop_deadline_, while not stopping_.
  bool waiting_before_stop_ = false;
  absl::Time before_stop_deadline_ = absl::InfiniteFuture();
  void CheckBeforeStop(absl::Time now);
};

std::vector<int> Attempt::RunningRanks() const {
  std::vector<int> running;
  for (const Rank& rank : ranks_) {
    if (!rank.child->exit_status().has_value()) running.push_back(rank.spec->rank);
  }
  return running;
}

void Attempt::CheckBeforeStop(absl::Time now) {
  if (!waiting_before_stop_ || stopping_) return;
  if (now < settle_until_) return;
  if (now < before_stop_deadline_ && !options_.ranks_to_wait_for(RunningRanks()).empty()) return;
  waiting_before_stop_ = false;
  BeginStop(SIGTERM, now);
}

void Attempt::BeginStop(int signal, absl::Time now) {
  if (stopping_ && signal != SIGKILL) return;
  stopping_ = true;
  kill_at_ = std::min(kill_at_, now + options_.grace_period);
  for (Rank& rank : ranks_) {
    if (!rank.child->exit_status().has_value()) rank.child->SignalGroup(signal);
  }
  if (signal == SIGKILL && !killed_) {
    killed_ = true;
    give_up_at_ = now + options_.reap_timeout;
  }
}

void Attempt::ReadStream(Rank& rank, bool is_stdout) {
  int fd = is_stdout ? rank.child->stdout_fd() : rank.child->stderr_fd();
  LinePrefixer& prefixer = is_stdout ? rank.out : rank.err;
  int out_fd = is_stdout ? options_.stdout_fd : options_.stderr_fd;
  char buffer[64 * 1024];
  ssize_t n = read(fd, buffer, sizeof(buffer));
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n > 0) {
    std::string lines = prefixer.Feed(absl::string_view(buffer, static_cast<size_t>(n)));
    if (!is_stdout && !lines.empty()) rank.last_stderr_line = LastLine(lines, prefixer.prefix());
    WriteAll(out_fd, lines);
    return;
  }
  std::string rest = prefixer.Finish();  // EOF or error: the stream is done
  if (!is_stdout && !rest.empty()) rank.last_stderr_line = LastLine(rest, prefixer.prefix());
  WriteAll(out_fd, rest);
  if (is_stdout) {
    rank.child->CloseStdout();
  } else {
    rank.child->CloseStderr();
  }
}

void Attempt::HandleSignals(absl::Time now) {
  for (int sig : signals_->ReadPending()) {
    if (sig == SIGCHLD) continue;  // reaping happens every loop turn anyway
    if (result_.signal == 0) {
      result_.signal = sig;
      Log(absl::StrCat("received ", SignalName(sig), ", forwarding it to all ranks"));
      stopping_ = false;  // forward this very signal, even if already stopping
      BeginStop(sig, now);
    } else {
      Log(absl::StrCat("received ", SignalName(sig), " again, sending SIGKILL"));
      BeginStop(SIGKILL, now);
    }
  }
}

std::string RankList(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) absl::StrAppend(&out, out.empty() ? "" : ", ", r);
  return out;
}

void Attempt::FailAttempt(RankFailure failure, absl::Time now) {
  for (const Rank& rank : ranks_) {
    if (!rank.child->exit_status().has_value()) failure.still_running.push_back(rank.spec->rank);
  }
  for (const RankFailure& f : peer_failures_) failure.followed_by.push_back(f.rank);
  std::sort(failure.followed_by.begin(), failure.followed_by.end());
  std::string followers =
      failure.followed_by.empty() || failure.peer_failure
          ? ""
          : absl::StrCat("; ranks ", RankList(failure.followed_by),
                         " stopped because of it (exit ", kPeerFailureExitCode, ")");
  if (failure.peer_failure && AllExited()) {
    // Every rank is gone and none failed on its own: the failure this
    // attempt's ranks followed happened outside this tpurun's ranks.
    Log(absl::StrCat("ranks ", RankList(failure.followed_by),
                     " stopped because another rank failed (exit ", kPeerFailureExitCode,
                     "); none of this tpurun's ranks failed for a reason of its own",
                     options_.peer_failure_hint.empty() ? "" : "; ",
                     options_.peer_failure_hint));
  } else if (failure.peer_failure) {
    Log(absl::StrCat("no rank failed for a reason of its own within ",
                     absl::FormatDuration(options_.root_cause_wait), " of ", failure.description,
                     " reporting another rank's failure (exit ", kPeerFailureExitCode, ")",
                     failure.still_running.empty()
                         ? ""
                         : absl::StrCat("; still running (hung?): ranks ",
                                        RankList(failure.still_running)),
                     "; stopping the other ranks (grace ",
                     absl::FormatDuration(options_.grace_period), ")"));
  } else {
    Log(absl::StrCat(failure.description, " failed: ", Describe(failure.status), followers,
                     "; stopping the other ranks (grace ",
                     absl::FormatDuration(options_.grace_period), ")"));
  }
  if (failure.peer_failure) failure.hint = options_.peer_failure_hint;
  result_.first_failure = std::move(failure);
  std::vector<int> wait_for;
  if (options_.ranks_to_wait_for) wait_for = options_.ranks_to_wait_for(RunningRanks());
  settle_until_ = now + options_.failure_settle_time;
  if (wait_for.empty() && options_.failure_settle_time > absl::ZeroDuration()) {
    waiting_before_stop_ = true;  // CheckBeforeStop stops them at settle_until_
    before_stop_deadline_ = settle_until_;
    return;
  }
  if (wait_for.empty()) {
    BeginStop(SIGTERM, now);
    return;
  }
  Log(absl::StrCat("waiting up to ", absl::FormatDuration(options_.before_stop_wait),
                   wait_for.size() == 1 ? " for rank " : " for ranks ", RankList(wait_for),
                   " to write flight-recorder dumps",
                   options_.before_stop_signal == 0
                       ? ""
                       : absl::StrCat(" (sent ", SignalName(options_.before_stop_signal), ")"),
                   " before stopping them"));
  for (Rank& rank : ranks_) {
    if (options_.before_stop_signal != 0 &&
        std::find(wait_for.begin(), wait_for.end(), rank.spec->rank) != wait_for.end()) {
      rank.child->SignalGroup(options_.before_stop_signal);
    }
  }
  waiting_before_stop_ = true;
  before_stop_deadline_ = now + options_.before_stop_wait;
}

bool Attempt::AllExited() const {
  for (const Rank& rank : ranks_) {
    if (!rank.child->exit_status().has_value()) return false;
  }
  return true;
}

void Attempt::ReapAndCheck(absl::Time now) {
  const bool stop_sent = stopping_;  // ranks reaped in this pass died before a stop we send now
  for (Rank& rank : ranks_) {
    if (rank.child->exit_status().has_value()) continue;
    std::optional<ExitStatus> status = rank.child->TryReap();
    if (!status.has_value()) continue;
    rank.exited_at = now;
    if (OwnFailure(*status, stop_sent)) failed_on_their_own_.push_back(rank.spec->rank);
    if (status->success() || stopping_ || result_.first_failure.has_value()) continue;
    RankFailure failure{rank.spec->rank, rank.spec->description, *status, now - start_};
    if (status->kind == ExitStatus::Kind::kExited && status->code == kPeerFailureExitCode) {
      // A follower: keep waiting a moment for the rank it followed.
      failure.peer_failure = true;
      if (peer_failures_.empty()) root_cause_deadline_ = now + options_.root_cause_wait;
      peer_failures_.push_back(std::move(failure));
      continue;
    }
    FailAttempt(std::move(failure), now);
  }
  if (!stopping_ && !result_.first_failure.has_value() && now >= root_cause_deadline_) {
    FailAttempt(peer_failures_.front(), now);
  }
  for (Rank& rank : ranks_) {
    // Exited, but something it spawned still holds its pipes open.
    bool pipes_open = rank.child->stdout_fd() >= 0 || rank.child->stderr_fd() >= 0;
    if (pipes_open && !rank.group_killed && now >= rank.exited_at + options_.drain_timeout) {
      rank.child->SignalGroup(SIGKILL);
      rank.group_killed = true;
    }
    if (pipes_open && now >= rank.exited_at + options_.drain_timeout + options_.reap_timeout) {
      ReadStream(rank, true), ReadStream(rank, false);
      rank.child->CloseStdout(), rank.child->CloseStderr();
    }
  }
}

void Attempt::ReapAllBounded() {
  absl::Time give_up = absl::Now() + options_.reap_timeout;
  for (Rank& rank : ranks_) {
    while (!rank.child->TryReap().has_value() && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
}

bool Attempt::Finished() const {
  for (const Rank& rank : ranks_) {
    if (!rank.child->exit_status().has_value()) return false;
    if (rank.child->stdout_fd() >= 0 || rank.child->stderr_fd() >= 0) return false;
  }
  return true;
}

absl::StatusOr<AttemptResult> Attempt::Run(const std::vector<ProcessSpec>& specs) {
  start_ = absl::Now();
  ranks_.reserve(specs.size());
  for (const ProcessSpec& spec : specs) {
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        ChildProcess::Start(spec.argv, spec.env, options_.exec_timeout);
    if (!child.ok()) {
      BeginStop(SIGKILL, absl::Now());
      ReapAllBounded();
      return absl::Status(child.status().code(), absl::StrCat("starting ", spec.description, ": ",
                                                              child.status().message()));
    }
    ranks_.push_back(Rank{&spec, *std::move(child), LinePrefixer(spec.output_prefix),
                          LinePrefixer(spec.output_prefix)});
  }
  while (!Finished()) {
    absl::Time now = absl::Now();
    if (now >= job_deadline_ && result_.outcome != ExitReport::Outcome::kTimedOut && !stopping_) {
      result_.outcome = ExitReport::Outcome::kTimedOut;
      Log("job timeout reached, stopping all ranks");
      BeginStop(SIGTERM, now);
    }
    if (stopping_ && now >= kill_at_ && !killed_) {
      Log("grace period over, sending SIGKILL to the ranks still running");
      BeginStop(SIGKILL, now);
    }
    if (killed_ && now >= give_up_at_) {
      for (const Rank& rank : ranks_) {
        if (!rank.child->exit_status().has_value()) {
          return absl::DeadlineExceededError(
              absl::StrCat(rank.spec->description, " (pid ", rank.child->pid(), ") still running ",
                           absl::FormatDuration(options_.reap_timeout), " after SIGKILL"));
        }
      }
    }
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, bool>> owners;
    fds.push_back({signals_->fd(), POLLIN, 0});
    for (Rank& rank : ranks_) {
      if (rank.child->stdout_fd() >= 0) {
        fds.push_back({rank.child->stdout_fd(), POLLIN, 0});
        owners.emplace_back(&rank, true);
      }
      if (rank.child->stderr_fd() >= 0) {
        fds.push_back({rank.child->stderr_fd(), POLLIN, 0});
        owners.emplace_back(&rank, false);
      }
    }
    absl::Duration wait = options_.poll_interval;
    if (stopping_ && !killed_) wait = std::min(wait, kill_at_ - now);
    if (!stopping_) wait = std::min(wait, job_deadline_ - now);
    if (!stopping_) wait = std::min(wait, root_cause_deadline_ - now);
    if (waiting_before_stop_ && !stopping_) wait = std::min(wait, before_stop_deadline_ - now);
    int wait_ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(wait)));
    int ready = poll(fds.data(), fds.size(), wait_ms);
    if (ready < 0 && errno != EINTR) return absl::InternalError("poll failed");
    now = absl::Now();
    for (size_t i = 1; ready > 0 && i < fds.size(); ++i) {
      if (fds[i].revents != 0) ReadStream(*owners[i - 1].first, owners[i - 1].second);
    }
    HandleSignals(now);
    ReapAndCheck(now);
    CheckBeforeStop(now);
  }
  if (!result_.first_failure.has_value() && !peer_failures_.empty()) {
    // Every rank exited before root_cause_wait ran out, some because another
    // rank failed: that is a failure, never a success (one tpurun per host:
    // the rank that failed is on another host).
    FailAttempt(peer_failures_.front(), absl::Now());
  }
  if (result_.first_failure.has_value() && result_.first_failure->peer_failure) {
    for (const Rank& rank : ranks_) {
      if (rank.spec->rank == result_.first_failure->rank) {
        result_.first_failure->last_stderr_line = rank.last_stderr_line;
      }
    }
  }
  if (result_.first_failure.has_value()) {
    absl::Duration stopped = absl::Now() - start_ - result_.first_failure->after;
    Log(absl::StrCat("all ranks stopped ",
                     absl::FormatDuration(absl::Trunc(stopped, absl::Milliseconds(1))),
                     " after the first failure"));
    std::vector<int>& own = result_.first_failure->failed_on_their_own;
    own = failed_on_their_own_;
    std::sort(own.begin(), own.end());
    if (options_.describe_failed_ranks && !own.empty()) {
      for (const std::string& line : options_.describe_failed_ranks(own)) Log(line);
    }
  }
  if (result_.signal != 0) {
    result_.outcome = ExitReport::Outcome::kInterrupted;
  } else if (result_.outcome != ExitReport::Outcome::kTimedOut && result_.first_failure) {
    result_.outcome = ExitReport::Outcome::kRankFailed;
  }
  for (const Rank& rank : ranks_) result_.exits.push_back(*rank.child->exit_status());
  return result_;
}

}  // namespace

int ExitReport::ExitCode() const {
  switch (outcome) {
    case Outcome::kSucceeded: return 0;
    case Outcome::kTimedOut: return 124;
    case Outcome::kInterrupted: return 128 + signal;
    case Outcome::kRankFailed: {
      int code = first_failure ? first_failure->status.ShellCode() : 1;
      return code > 0 && code < 256 ? code : 1;
    }
  }
  return 1;
}

std::string ExitReport::Summary() const {
  std::string restarts_note =
      restarts == 0
          ? ""
          : absl::StrCat(" (after ", restarts, restarts == 1 ? " restart)" : " restarts)");
  std::string failure_note = first_failure
                                 ? absl::StrCat("; first failure: ", first_failure->description,
                                                " ", Describe(first_failure->status))
                                 : "";
  switch (outcome) {
    case Outcome::kSucceeded:
      return absl::StrCat("all ", exits.size(), " ranks succeeded in ",
                          absl::FormatDuration(absl::Trunc(elapsed, absl::Milliseconds(1))),
                          restarts_note);
    case Outcome::kRankFailed: {
      const RankFailure& f = *first_failure;
      if (f.peer_failure) {
        return absl::StrCat(
            f.description, " stopped because another rank failed (exit ", kPeerFailureExitCode,
            "); no rank failed for a reason of its own",
            f.still_running.empty()
                ? ""
                : absl::StrCat("; still running when stopped (hung?): ranks ",
                               RankList(f.still_running)),
            f.hint.empty() ? "" : "; ", f.hint,
            f.last_stderr_line.empty()
                ? ""
                : absl::StrCat("; its last stderr line: ", f.last_stderr_line),
            restarts_note);
      }
      return absl::StrCat(f.description, " failed: ", Describe(f.status),
                          f.followed_by.empty()
                              ? ""
                              : absl::StrCat("; ranks ", RankList(f.followed_by),
                                             " stopped because of it"),
                          restarts_note);
    }
    case Outcome::kTimedOut:
      return absl::StrCat("job timed out after ",
                          absl::FormatDuration(absl::Trunc(elapsed, absl::Milliseconds(1))),
                          failure_note, restarts_note);
    case Outcome::kInterrupted:
      return absl::StrCat("interrupted by ", SignalName(signal), failure_note, restarts_note);
  }
  return "unknown outcome";
}

absl::StatusOr<ExitReport> SuperviseProcessGroup(const LaunchPlanner& planner,
                                                 const SupervisorOptions& options) {
  absl::Time start = absl::Now();
  absl::Time job_deadline = options.timeout == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                                        : start + options.timeout;
  absl::StatusOr<std::unique_ptr<SignalWatcher>> signals = SignalWatcher::Create();
  if (!signals.ok()) return signals.status();
  ExitReport report;
  for (int restart = 0;; ++restart) {
    absl::StatusOr<std::vector<ProcessSpec>> specs = planner(restart);
    if (!specs.ok()) return specs.status();
    for (ProcessSpec& spec : *specs) {
      spec.env["TORCHELASTIC_RESTART_COUNT"] = absl::StrCat(restart);
      spec.env["TPU_DIST_RESTART_COUNT"] = absl::StrCat(restart);
      spec.env["TORCHELASTIC_MAX_RESTARTS"] = absl::StrCat(options.max_restarts);
    }
    Attempt attempt(options, signals->get(), job_deadline);
    absl::StatusOr<AttemptResult> result = attempt.Run(*specs);
    if (!result.ok()) return result.status();
    if (options.after_failed_attempt && (result->outcome == ExitReport::Outcome::kRankFailed ||
                                         result->outcome == ExitReport::Outcome::kTimedOut)) {
      options.after_failed_attempt(restart);
    }
    report.restarts = restart;
    report.outcome = result->outcome;
    report.first_failure = result->first_failure;
    report.signal = result->signal;
    report.exits = result->exits;
    report.elapsed = absl::Now() - start;
    if (report.outcome != ExitReport::Outcome::kRankFailed || restart >= options.max_restarts) {
      return report;
    }
    WriteAll(options.stderr_fd, absl::StrCat(options.log_prefix, "restarting all ranks (restart ",
                                             restart + 1, " of ", options.max_restarts, ")\n"));
  }
}

}  // namespace tpudist::tpu_runtime::launcher
