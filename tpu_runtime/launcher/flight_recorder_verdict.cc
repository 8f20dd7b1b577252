#include "tpu_runtime/launcher/flight_recorder_verdict.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "tpu_runtime/launcher/child_process.h"

namespace tpudist::tpu_runtime::launcher {
namespace {

bool FileExists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

struct AnalyzerRun {
  std::optional<ExitStatus> status;  // nullopt: killed at the timeout
  std::string out, err;
};

// Reads `fd` into `sink`; closes the stream at EOF.
void Drain(ChildProcess& child, bool is_stdout, std::string* sink) {
  char buffer[16 * 1024];
  const int fd = is_stdout ? child.stdout_fd() : child.stderr_fd();
  ssize_t n = read(fd, buffer, sizeof(buffer));
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n > 0) {
    constexpr size_t kMaxKept = 4 << 20;  // a runaway analyzer cannot eat the launcher's memory
    if (sink->size() < kMaxKept) sink->append(buffer, static_cast<size_t>(n));
    return;
  }
  is_stdout ? child.CloseStdout() : child.CloseStderr();
}

absl::StatusOr<AnalyzerRun> RunBounded(const std::vector<std::string>& argv,
                                       absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> started =
      ChildProcess::Start(argv, EnvMap{}, absl::Seconds(5));
  if (!started.ok()) return started.status();
  ChildProcess& child = **started;
  AnalyzerRun run;
  const absl::Time deadline = absl::Now() + timeout;
  while (child.stdout_fd() >= 0 || child.stderr_fd() >= 0 || !child.TryReap().has_value()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      child.SignalGroup(SIGKILL);
      for (absl::Time give_up = now + absl::Seconds(5);
           !child.TryReap().has_value() && absl::Now() < give_up;) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      return run;  // status unset: timed out
    }
    pollfd fds[2];
    nfds_t n = 0;
    if (child.stdout_fd() >= 0) fds[n++] = {child.stdout_fd(), POLLIN, 0};
    if (child.stderr_fd() >= 0) fds[n++] = {child.stderr_fd(), POLLIN, 0};
    const int wait_ms = static_cast<int>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(deadline - now), 0, 50));
    if (n == 0) {
      absl::SleepFor(absl::Milliseconds(5));  // streams closed; waiting for the exit
      continue;
    }
    if (poll(fds, n, wait_ms) <= 0) continue;
    for (nfds_t i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      const bool is_stdout = fds[i].fd == child.stdout_fd();
      Drain(child, is_stdout, is_stdout ? &run.out : &run.err);
    }
  }
  run.status = child.exit_status();
  return run;
}

// "{1}" -> "rank 1"; "{0, 2}" -> "ranks 0, 2".
std::string RankSet(absl::string_view set) {
  absl::ConsumePrefix(&set, "{");
  absl::ConsumeSuffix(&set, "}");
  return absl::StrCat(absl::StrContains(set, ",") ? "ranks " : "rank ", set);
}

std::string AfterColon(absl::string_view line) {
  const size_t colon = line.find(": ");
  return colon == absl::string_view::npos ? std::string(line)
                                          : std::string(line.substr(colon + 2));
}

}  // namespace

std::optional<DumpLocation> ResolveDumpLocation(
    const std::function<const char*(const char*)>& lookup, absl::string_view job_id,
    int restart) {
  const char* size = lookup(kFlightRecorderSizeEnv);
  if (size != nullptr && absl::string_view(size) == "0") return std::nullopt;
  DumpLocation where;
  const char* dir = lookup(kFlightRecorderDirEnv);
  const char* prefix = lookup(kTorchDumpPrefixEnv);
  if (dir != nullptr && *dir != '\0') {
    where.dir = dir;
  } else if (prefix != nullptr && *prefix != '\0') {
    const absl::string_view p(prefix);
    const size_t slash = p.rfind('/');
    where.dir = slash == absl::string_view::npos ? "." : std::string(p.substr(0, slash));
    where.file_prefix = std::string(slash == absl::string_view::npos ? p : p.substr(slash + 1));
  } else {
    const char* tmp = lookup("TMPDIR");
    where.dir = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/tpurun_fr/", job_id,
                             "/attempt_", restart);
    where.set_by_launcher = true;
  }
  return where;
}

std::vector<int> RanksWithDumps(const DumpLocation& where, const std::vector<int>& ranks) {
  std::vector<int> found;
  for (int rank : ranks) {
    if (FileExists(absl::StrCat(where.dir, "/", where.file_prefix, rank))) found.push_back(rank);
  }
  return found;
}

std::string ChooseAnalyzerPython(absl::string_view flag, const char* env_value,
                                 const std::vector<std::string>& command,
                                 const char* virtual_env) {
  std::string chosen(flag);
  if (chosen.empty() && env_value != nullptr) chosen = env_value;
  if (chosen == "none") return "";
  if (!chosen.empty()) return chosen;
  if (!command.empty()) {
    absl::string_view name(command[0]);
    const size_t slash = name.rfind('/');
    if (slash != absl::string_view::npos) name.remove_prefix(slash + 1);
    if (absl::StartsWith(name, "python")) return command[0];
  }
  if (virtual_env != nullptr && *virtual_env != '\0') {
    return absl::StrCat(virtual_env, "/bin/python");
  }
  return "python3";
}

std::vector<std::string> AnalyzerArgv(const std::string& python, const DumpLocation& where,
                                      bool incomplete) {
  std::vector<std::string> argv = {python, "-m", "torch.distributed.flight_recorder.fr_trace",
                                   "-p", where.file_prefix, "--mismatch_cap", "5"};
  if (incomplete) argv.push_back("--allow-incomplete-ranks");
  argv.push_back(where.dir);
  return argv;
}

std::vector<std::string> VerdictLines(absl::string_view output, size_t max_lines) {
  std::vector<std::string> lines;
  size_t dropped = 0;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    line = absl::StripTrailingAsciiWhitespace(line);
    if (absl::StripAsciiWhitespace(line).empty() ||
        absl::StartsWith(line, "unrecognized comm library") ||
        absl::StartsWith(line, "tabulate is not installed") || line == "collective stack trace:") {
      continue;
    }
    if (lines.size() < max_lines) {
      lines.emplace_back(line);
    } else {
      ++dropped;
    }
  }
  if (dropped > 0) lines.push_back(absl::StrCat("... ", dropped, " more lines"));
  return lines;
}

std::string VerdictHeadline(const std::vector<std::string>& lines) {
  constexpr absl::string_view kMissing = "Not all ranks joining collective, sequence number: ";
  constexpr absl::string_view kErrors = "Collective sequence number: ";
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::string_view line = lines[i];
    std::string seq;
    bool missing = false;
    if (absl::ConsumePrefix(&line, kMissing)) {
      seq = std::string(line);
      missing = true;
    } else if (absl::ConsumePrefix(&line, kErrors) && absl::ConsumeSuffix(&line, " has errors")) {
      seq = std::string(line);
    } else {
      continue;
    }
    std::string collective, detail;
    // The block's fields follow until the next block.
    for (size_t j = i + 1; j < lines.size(); ++j) {
      absl::string_view field = lines[j];
      if (absl::StartsWith(field, kMissing) || absl::StartsWith(field, kErrors)) break;
      if (absl::StartsWith(field, "collective: ")) collective = AfterColon(field);
      if (missing && absl::StartsWith(field, "missing ranks: ")) {
        detail = absl::StrCat(RankSet(AfterColon(field)), " never joined it (behind: stuck "
                              "before it, or in another op)");
      }
      if (!missing && absl::StartsWith(field, "error msg: ")) detail = AfterColon(field);
    }
    return absl::StrCat("sequence id ", seq, collective.empty() ? "" : ", ", collective, ": ",
                        detail.empty() ? "see below" : detail);
  }
  return "";
}

std::vector<std::string> FlightRecorderVerdict(const DumpLocation& where,
                                               const std::vector<int>& ranks,
                                               const std::string& python, absl::Duration timeout) {
  const std::vector<int> dumped = RanksWithDumps(where, ranks);
  if (dumped.empty()) return {};
  std::vector<int> absent;
  for (int rank : ranks) {
    if (std::find(dumped.begin(), dumped.end(), rank) == dumped.end()) absent.push_back(rank);
  }
  const std::string dumps_note =
      absl::StrCat(dumped.size(), " of ", ranks.size(), " ranks dumped to ", where.dir,
                   absent.empty() ? "" : absl::StrCat(" (none from ranks ",
                                                      absl::StrJoin(absent, ", "), ")"));
  if (python.empty()) return {absl::StrCat(dumps_note, "; analyzer off (--fr-analyzer=none)")};
  const std::vector<std::string> argv = AnalyzerArgv(python, where, !absent.empty());
  const absl::Time start = absl::Now();
  absl::StatusOr<AnalyzerRun> run = RunBounded(argv, timeout);
  const std::string took =
      absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(100)));
  if (!run.ok()) {
    return {absl::StrCat(dumps_note, "; no analyzer: cannot run ", python, " (",
                         run.status().message(), "); give a Python with torch in --fr-analyzer "
                         "or ", kFlightRecorderAnalyzerEnv)};
  }
  if (!run->status.has_value()) {
    return {absl::StrCat(dumps_note, "; the analyzer (", python, ") did not finish within ",
                         absl::FormatDuration(timeout), ": killed, no verdict")};
  }
  if (!run->status->success()) {
    if (absl::StrContains(run->err, "No module named")) {
      return {absl::StrCat(dumps_note, "; no analyzer: ", python,
                           " has no torch.distributed.flight_recorder; give a Python with torch "
                           "in --fr-analyzer or ", kFlightRecorderAnalyzerEnv)};
    }
    std::vector<std::string> tail = VerdictLines(run->err, 1000);
    return {absl::StrCat(dumps_note, "; the analyzer failed (", Describe(*run->status), ")",
                         tail.empty() ? "" : ": ", tail.empty() ? "" : tail.back())};
  }
  std::vector<std::string> lines = VerdictLines(absl::StrCat(run->out, "\n", run->err), 40);
  const std::string headline = VerdictHeadline(lines);
  std::vector<std::string> result = {
      absl::StrCat("verdict: ", headline.empty() ? "the analyzer found no mismatch" : headline)};
  for (std::string& line : lines) result.push_back(absl::StrCat("  ", line));
  result.push_back(absl::StrCat(dumps_note, "; torch's analyzer took ", took, ": ",
                                absl::StrJoin(argv, " ")));
  return result;
}

}  // namespace tpudist::tpu_runtime::launcher
