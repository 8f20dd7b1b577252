#include "tpu_runtime/launcher/dcn_link.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

extern char** environ;

namespace tpudist::tpu_runtime::launcher {
namespace {

constexpr absl::Duration kCommandTimeout = absl::Seconds(10);
constexpr char kPrefix[] = "tpudcn";

struct CommandResult {
  int exit_code = -1;  // -1: did not finish (killed at the deadline) or not started
  std::string output;  // stdout and stderr together
};

// Runs argv (argv[0] from PATH) with stdout+stderr captured, killed after
// kCommandTimeout.
CommandResult RunCommand(const std::vector<std::string>& argv) {
  CommandResult result;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    result.output = absl::StrCat("pipe: ", strerror(errno));
    return result;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    result.output = absl::StrCat("cannot start ", argv[0], ": ", strerror(rc));
    return result;
  }
  const absl::Time deadline = absl::Now() + kCommandTimeout;
  char buf[4096];
  bool timed_out = false;
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buf, n);
  }
  close(fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    result.output += absl::StrCat(" (killed after ", absl::FormatDuration(kCommandTimeout), ")");
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  }
  return result;
}

std::string DelayText(absl::Duration d) {
  return absl::StrCat(absl::ToInt64Microseconds(d), "us");
}

}  // namespace

absl::StatusOr<DcnShape> ParseDcnShape(absl::string_view rate, absl::Duration delay) {
  DcnShape shape;
  if (!rate.empty()) {
    const std::string lower = absl::AsciiStrToLower(rate);
    size_t digits = 0;
    while (digits < lower.size() && (isdigit(lower[digits]) || lower[digits] == '.')) ++digits;
    const std::string unit = lower.substr(digits);
    double value = 0;
    const bool unit_ok = unit == "bit" || unit == "kbit" || unit == "mbit" || unit == "gbit" ||
                         unit == "tbit";
    if (!unit_ok || !absl::SimpleAtod(lower.substr(0, digits), &value) || !(value > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--dcn-rate=\"", rate,
          "\": expected a positive number and a unit bit, kbit, mbit, gbit or tbit (e.g. 10gbit)"));
    }
    shape.rate = lower;
  }
  if (delay < absl::ZeroDuration() || delay > absl::Seconds(10)) {
    return absl::InvalidArgumentError(absl::StrCat("--dcn-delay=", absl::FormatDuration(delay),
                                                   ": expected 0 (off) .. 10s, e.g. 100us"));
  }
  if (delay > absl::ZeroDuration() && delay < absl::Microseconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat("--dcn-delay=", absl::FormatDuration(delay),
                                                   ": expected whole microseconds (tc's unit)"));
  }
  shape.delay = delay;
  return shape;
}

absl::Status CheckDcnShapeUsable(const DcnShape& shape, int num_slices, bool hosts_emulated,
                                 bool hostnames_given) {
  if (!shape.enabled()) return absl::OkStatus();
  const std::string flag =
      !shape.rate.empty() ? absl::StrCat("--dcn-rate=", shape.rate)
                          : absl::StrCat("--dcn-delay=", absl::FormatDuration(shape.delay));
  if (num_slices < 2 || !hosts_emulated) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": shapes the link between emulated slices; needs --hosts-emulated and "
              "--num-slices >= 2 (got --num-slices=",
        num_slices, hosts_emulated ? "" : ", no --hosts-emulated", ")"));
  }
  if (hostnames_given) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": the shaped slices have their own addresses (10.251.<s>.<h+1>); drop --hostnames"));
  }
  return absl::OkStatus();
}

std::string DcnHostAddress(int slice, int host) {
  return absl::StrCat("10.251.", slice, ".", host + 1);
}

std::string DcnBridgeNamespace(int pid) { return absl::StrCat(kPrefix, pid, "b"); }
std::string DcnSliceNamespace(int pid, int slice) {
  return absl::StrCat(kPrefix, pid, "s", slice);
}

std::vector<std::vector<std::string>> DcnSetupCommands(int pid, int num_slices,
                                                       int hosts_per_slice,
                                                       const DcnShape& shape) {
  const std::string br = DcnBridgeNamespace(pid);
  const std::string eth = DcnLink::kInterface;
  std::vector<std::vector<std::string>> c = {
      {"ip", "netns", "add", br},
      {"ip", "-n", br, "link", "set", "lo", "up"},
      {"ip", "-n", br, "link", "add", "br0", "type", "bridge"},
      {"ip", "-n", br, "link", "set", "br0", "up"},
  };
  for (int s = 0; s < num_slices; ++s) {
    const std::string ns = DcnSliceNamespace(pid, s), port = absl::StrCat("s", s);
    c.push_back({"ip", "netns", "add", ns});
    c.push_back({"ip", "-n", ns, "link", "set", "lo", "up"});
    c.push_back({"ip", "-n", br, "link", "add", port, "type", "veth", "peer", "name", eth,
                 "netns", ns});
    c.push_back({"ip", "-n", br, "link", "set", port, "master", "br0"});
    c.push_back({"ip", "-n", br, "link", "set", port, "up"});
    for (int h = 0; h < hosts_per_slice; ++h) {
      c.push_back({"ip", "-n", ns, "addr", "add", DcnHostAddress(s, h) + "/16", "dev", eth});
    }
    c.push_back({"ip", "-n", ns, "link", "set", eth, "up"});
    const std::vector<std::string> netem = {"netem", "delay", DelayText(shape.delay), "limit",
                                            "100000"};
    if (!shape.rate.empty()) {
      c.push_back({"tc", "-n", ns, "qdisc", "add", "dev", eth, "root", "handle", "1:", "htb",
                   "default", "1"});
      c.push_back({"tc", "-n", ns, "class", "add", "dev", eth, "parent", "1:", "classid", "1:1",
                   "htb", "rate", shape.rate, "ceil", shape.rate});
      if (shape.delay > absl::ZeroDuration()) {
        std::vector<std::string> add = {"tc", "-n", ns, "qdisc", "add", "dev", eth,
                                        "parent", "1:1", "handle", "10:"};
        add.insert(add.end(), netem.begin(), netem.end());
        c.push_back(add);
      }
    } else if (shape.delay > absl::ZeroDuration()) {
      std::vector<std::string> add = {"tc", "-n", ns, "qdisc", "add", "dev", eth, "root",
                                      "handle", "10:"};
      add.insert(add.end(), netem.begin(), netem.end());
      c.push_back(add);
    }
  }
  return c;
}

DcnLink::DcnLink(int pid, int num_slices, int hosts_per_slice, DcnShape shape)
    : pid_(pid),
      num_slices_(num_slices),
      hosts_per_slice_(hosts_per_slice),
      shape_(std::move(shape)) {}

absl::StatusOr<std::unique_ptr<DcnLink>> DcnLink::Create(int num_slices, int hosts_per_slice,
                                                         const DcnShape& shape) {
  std::unique_ptr<DcnLink> link(new DcnLink(getpid(), num_slices, hosts_per_slice, shape));
  for (const std::vector<std::string>& argv :
       DcnSetupCommands(link->pid_, num_slices, hosts_per_slice, shape)) {
    CommandResult r = RunCommand(argv);
    if (r.exit_code == 0) continue;
    const bool netem = std::find(argv.begin(), argv.end(), "netem") != argv.end();
    const bool tc = argv[0] == "tc";
    const std::string flag =
        netem ? absl::StrCat("--dcn-delay=", absl::FormatDuration(shape.delay))
        : tc  ? absl::StrCat("--dcn-rate=", shape.rate)
              : "--dcn-rate/--dcn-delay";
    std::string hint;
    if (netem && absl::StrContains(r.output, "unknown")) {
      hint = " (this kernel has no sch_netem: --dcn-rate alone works without it)";
    }
    return absl::FailedPreconditionError(absl::StrCat(
        flag, ": building the shaped DCN failed: `", absl::StrJoin(argv, " "), "` exited ",
        r.exit_code, ": ", absl::StripAsciiWhitespace(r.output), hint));
  }  // on return of an error, ~DcnLink removes what was built
  return link;
}

DcnLink::~DcnLink() {
  for (int s = 0; s < num_slices_; ++s) {
    RunCommand({"ip", "netns", "del", DcnSliceNamespace(pid_, s)});
  }
  RunCommand({"ip", "netns", "del", DcnBridgeNamespace(pid_)});
}

std::vector<std::string> DcnLink::Hostnames() const {
  std::vector<std::string> out;
  for (int s = 0; s < num_slices_; ++s) {
    for (int h = 0; h < hosts_per_slice_; ++h) out.push_back(DcnHostAddress(s, h));
  }
  return out;
}

std::vector<std::string> DcnLink::WrapArgv(int slice, const std::vector<std::string>& argv) const {
  std::vector<std::string> out = {"ip", "netns", "exec", DcnSliceNamespace(pid_, slice)};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

absl::StatusOr<int64_t> DcnLink::TxBytes(int slice) const {
  const std::string ns = DcnSliceNamespace(pid_, slice);
  CommandResult r = RunCommand({"ip", "netns", "exec", ns, "cat",
                                absl::StrCat("/sys/class/net/", kInterface, "/statistics/tx_bytes")});
  int64_t bytes = 0;
  if (r.exit_code != 0 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(r.output), &bytes)) {
    return absl::UnavailableError(absl::StrCat("tx_bytes of ", kInterface, " in netns ", ns, ": ",
                                               absl::StripAsciiWhitespace(r.output)));
  }
  return bytes;
}

std::string DcnLink::Describe() const {
  std::string what = shape_.rate.empty() ? "unlimited rate" : shape_.rate;
  if (shape_.delay > absl::ZeroDuration()) absl::StrAppend(&what, ", delay ", DelayText(shape_.delay));
  return absl::StrCat("shaped DCN: ", num_slices_, " slices, ", what,
                      " per slice link each way (netns ", DcnSliceNamespace(pid_, 0), "..",
                      num_slices_ - 1, ", hosts 10.251.<s>.<h+1>)");
}

void RemoveStaleDcnNamespaces() {
  DIR* dir = opendir("/var/run/netns");
  if (dir == nullptr) return;
  std::vector<std::string> stale;
  while (dirent* e = readdir(dir)) {
    absl::string_view name = e->d_name;
    if (!absl::ConsumePrefix(&name, kPrefix)) continue;
    size_t digits = 0;
    while (digits < name.size() && isdigit(name[digits])) ++digits;
    int pid = 0;
    if (!absl::SimpleAtoi(name.substr(0, digits), &pid) || pid <= 0) continue;
    if (kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(e->d_name);
  }
  closedir(dir);
  for (const std::string& ns : stale) RunCommand({"ip", "netns", "del", ns});
}

}  // namespace tpudist::tpu_runtime::launcher
