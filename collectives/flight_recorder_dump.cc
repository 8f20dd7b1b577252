#include "collectives/flight_recorder_dump.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "collectives/exception_message.h"
#include "torch/csrc/jit/serialization/pickler.h"

namespace tpudist::collectives {
namespace {

constexpr char kVersion[] = "2.10";  // torch's FlightRecorder version_val
constexpr char kRequestKey[] = "flight_recorder/dump_requests";

c10::Dict<c10::IValue, c10::IValue> NewDict() {
  return c10::Dict<c10::IValue, c10::IValue>(c10::AnyType::get(), c10::AnyType::get());
}

c10::List<c10::IValue> NewList() { return c10::List<c10::IValue>(c10::AnyType::get()); }

c10::List<c10::IValue> Sizes(const std::vector<std::vector<int64_t>>& sizes) {
  c10::List<c10::IValue> out = NewList();
  for (const std::vector<int64_t>& s : sizes) {
    c10::List<c10::IValue> one = NewList();
    for (int64_t d : s) one.push_back(d);
    out.push_back(one);
  }
  return out;
}

c10::List<c10::IValue> Dtypes(const std::vector<c10::ScalarType>& dtypes) {
  c10::List<c10::IValue> out = NewList();
  for (c10::ScalarType t : dtypes) out.push_back(std::string(c10::toString(t)));
  return out;
}

const char* StateName(FlightRecorder::State s) {
  switch (s) {
    case FlightRecorder::State::kScheduled: return "scheduled";
    case FlightRecorder::State::kStarted: return "started";
    case FlightRecorder::State::kCompleted: return "completed";
  }
  return "scheduled";
}

c10::IValue OptionalNs(const std::optional<int64_t>& t) {
  return t.has_value() ? c10::IValue(*t) : c10::IValue();
}

std::string Pickle(const c10::IValue& v) {
  std::string out;
  torch::jit::Pickler pickler([&](const char* data, size_t n) { out.append(data, n); },
                              nullptr, nullptr, nullptr, nullptr, false);
  pickler.protocol();
  pickler.pushIValue(v);
  pickler.stop();
  return out;
}

// The process's live recorders (weak) and their dump prefixes.
struct Registered {
  std::weak_ptr<FlightRecorder> recorder;
  std::string dump_prefix;
};

struct Directory {
  absl::Mutex mu;
  std::vector<Registered> recorders ABSL_GUARDED_BY(mu);
  absl::Mutex dump_mu;  // serializes dumps (same files)
  absl::Time last_auto_dump ABSL_GUARDED_BY(dump_mu) = absl::InfinitePast();
};

Directory& Dir() {
  static Directory* d = new Directory();  // never destroyed: dumps may run at exit
  return *d;
}

// Live recorders by global rank, with the first non-empty prefix per rank.
struct RankRecorders {
  std::vector<std::shared_ptr<FlightRecorder>> recorders;
  std::string prefix;
};

std::map<int64_t, RankRecorders> LiveByRank() {
  Directory& d = Dir();
  absl::MutexLock lock(&d.mu);
  std::map<int64_t, RankRecorders> out;
  auto& list = d.recorders;
  list.erase(std::remove_if(list.begin(), list.end(),
                            [](const Registered& r) { return r.recorder.expired(); }),
             list.end());
  for (const Registered& r : list) {
    std::shared_ptr<FlightRecorder> p = r.recorder.lock();
    if (!p) continue;
    RankRecorders& rr = out[p->global_rank()];
    rr.recorders.push_back(p);
    if (rr.prefix.empty()) rr.prefix = r.dump_prefix;
  }
  return out;
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  std::error_code ec;
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  // A name without the prefix in it: torch's loader reads every file of the
  // directory whose name contains the prefix.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      (p.parent_path() / absl::StrCat(".tpud-fr-tmp-", getpid(), "-", counter.fetch_add(1)))
          .string();
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return absl::UnavailableError(absl::StrCat("cannot create ", tmp));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

// SIGUSR1 -> this eventfd, polled by every watcher (one of them reads it).
std::atomic<int> signal_fd{-1};

void OnSigusr1(int) {
  const int saved = errno;
  const int fd = signal_fd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const uint64_t one = 1;
    ssize_t n = write(fd, &one, sizeof(one));  // async-signal-safe
    (void)n;
  }
  errno = saved;
}

void InstallSigusr1Once() {
  static std::once_flag once;
  std::call_once(once, [] {
    const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) return;
    signal_fd.store(fd);
    struct sigaction old {};
    if (sigaction(SIGUSR1, nullptr, &old) != 0) return;
    // Someone else's handler (or SIG_IGN) wins: SIGUSR1 then dumps nothing.
    if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) return;
    struct sigaction sa {};
    sa.sa_handler = OnSigusr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, nullptr);
  });
}

}  // namespace

std::string FlightRecorderPickle(absl::Span<const std::shared_ptr<FlightRecorder>> recorders) {
  struct Tagged {
    FlightRecorder::Entry e;
    const FlightRecorder* r;
    FlightRecorder::Group g;
  };
  std::vector<Tagged> all;
  c10::Dict<c10::IValue, c10::IValue> pg_config = NewDict();
  c10::Dict<c10::IValue, c10::IValue> pg_status = NewDict();
  for (const std::shared_ptr<FlightRecorder>& r : recorders) {
    const FlightRecorder::Group g = r->group();
    c10::Dict<c10::IValue, c10::IValue> info = NewDict();
    info.insert("name", g.name);
    info.insert("desc", g.desc);
    info.insert("ranks", absl::StrCat("[", absl::StrJoin(g.global_ranks, ", "), "]"));
    pg_config.insert(g.name, info);
    const FlightRecorder::Progress p = r->progress();
    c10::Dict<c10::IValue, c10::IValue> status = NewDict();
    status.insert("last_enqueued_collective", p.last_enqueued);
    status.insert("last_started_collective", p.last_started);
    status.insert("last_completed_collective", p.last_completed);
    pg_status.insert(std::to_string(r->id()), status);
    for (FlightRecorder::Entry& e : r->Entries()) all.push_back({std::move(e), r.get(), g});
  }
  std::sort(all.begin(), all.end(),
            [](const Tagged& a, const Tagged& b) { return a.e.record_id < b.e.record_id; });
  c10::List<c10::IValue> entries = NewList();
  for (const Tagged& t : all) {
    const FlightRecorder::Entry& e = t.e;
    c10::Dict<c10::IValue, c10::IValue> d = NewDict();
    d.insert("frames", NewList());
    d.insert("record_id", static_cast<int64_t>(e.record_id));
    d.insert("pg_id", static_cast<int64_t>(t.r->id()));
    d.insert("process_group", std::make_tuple(t.g.name, t.g.desc));
    d.insert("thread_name", std::string("tpu_dist"));
    d.insert("thread_id", std::string(""));
    d.insert("collective_seq_id", static_cast<int64_t>(e.op.collective_seq_id));
    d.insert("p2p_seq_id", static_cast<int64_t>(e.op.p2p_seq_id));
    d.insert("op_id", static_cast<int64_t>(e.op_id));
    d.insert("profiling_name", absl::StrCat("tpu_dist:", e.op.name));
    d.insert("time_created_ns", e.time_created_ns);
    d.insert("input_sizes", Sizes(e.op.input_sizes));
    d.insert("input_dtypes", Dtypes(e.op.input_dtypes));
    d.insert("output_sizes", Sizes(e.op.output_sizes));
    d.insert("output_dtypes", Dtypes(e.op.output_dtypes));
    d.insert("state", std::string(StateName(e.state)));
    d.insert("time_discovered_started_ns", OptionalNs(e.time_started_ns));
    d.insert("time_discovered_completed_ns", OptionalNs(e.time_completed_ns));
    d.insert("retired", e.retired);
    d.insert("timeout_ms", e.op.timeout_ms);
    d.insert("is_p2p", e.op.is_p2p);
    if (!e.error.empty()) d.insert("error", e.error);
    entries.push_back(d);
  }
  c10::Dict<c10::IValue, c10::IValue> result = NewDict();
  result.insert("version", std::string(kVersion));
  result.insert("comm_lib_version", std::string("tpu_dist"));
  result.insert("pg_config", pg_config);
  result.insert("pg_status", pg_status);
  result.insert("entries", entries);
  return Pickle(result);
}

void RegisterFlightRecorder(const std::shared_ptr<FlightRecorder>& recorder,
                            const std::string& dump_prefix) {
  Directory& d = Dir();
  absl::MutexLock lock(&d.mu);
  d.recorders.push_back({recorder, dump_prefix});
}

absl::StatusOr<std::vector<std::string>> DumpFlightRecorders(const std::string& prefix,
                                                             const std::string& reason,
                                                             bool quiet) {
  std::map<int64_t, RankRecorders> live = LiveByRank();
  absl::MutexLock lock(&Dir().dump_mu);
  std::vector<std::string> paths;
  for (const auto& [rank, rr] : live) {
    const std::string& p = prefix.empty() ? rr.prefix : prefix;
    if (p.empty()) {
      return absl::FailedPreconditionError(
          "tpu_dist flight recorder: no dump location (pass a prefix, or set "
          "TPU_DIST_FLIGHT_RECORDER_DIR or TORCH_FR_DUMP_TEMP_FILE)");
    }
    const std::string path = absl::StrCat(p, rank);
    absl::Status s = WriteFileAtomically(path, FlightRecorderPickle(rr.recorders));
    if (!s.ok()) return s;
    if (!quiet) {
      std::fprintf(stderr, "tpu_dist: rank %lld: flight recorder dump (%s): %s\n",
                   static_cast<long long>(rank), reason.c_str(), path.c_str());
    }
    paths.push_back(path);
  }
  return paths;
}

bool AutoDumpFlightRecorders(const std::string& reason, bool force) {
  std::map<int64_t, RankRecorders> live = LiveByRank();
  bool any = false;
  for (const auto& [rank, rr] : live) any = any || !rr.prefix.empty();
  if (!any) return false;
  {
    Directory& d = Dir();
    absl::MutexLock lock(&d.dump_mu);
    const absl::Time now = absl::Now();
    if (!force && now - d.last_auto_dump < absl::Seconds(1)) return false;
    d.last_auto_dump = now;
  }
  // Only the ranks with a prefix: DumpFlightRecorders("") fails on the others.
  absl::StatusOr<std::vector<std::string>> paths = DumpFlightRecorders("", reason);
  if (!paths.ok()) {
    std::fprintf(stderr, "tpu_dist: flight recorder dump (%s) failed: %s\n", reason.c_str(),
                 paths.status().ToString().c_str());
    return false;
  }
  return true;
}

FlightRecorderWatcher::FlightRecorderWatcher(const c10::intrusive_ptr<c10d::Store>& store,
                                             absl::Duration poll)
    : poll_(poll) {
  InstallSigusr1Once();
  try {
    store_ = store->clone();  // own connection: polls never wait behind an op's
    store_->setTimeout(std::chrono::seconds(5));
  } catch (const std::exception&) {
    store_ = store;  // no clone (HashStore): shared
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "tpud-fr");
    Loop();
  });
}

FlightRecorderWatcher::~FlightRecorderWatcher() {
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void FlightRecorderWatcher::RequestDumpEverywhere() {
  request_.store(true);
  const uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof(one));
  (void)n;
}

void FlightRecorderWatcher::Stop() {
  if (!stop_.exchange(true)) {
    const uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof(one));
    (void)n;
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void FlightRecorderWatcher::Loop() {
  int64_t seen = 0;  // requests seen (the counter's value)
  bool store_ok = true;
  const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(poll_));
  bool stopping = false;
  while (!stopping) {
    struct pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {signal_fd.load(), POLLIN, 0}};
    const int nfds = fds[1].fd >= 0 ? 2 : 1;
    ::poll(fds, nfds, timeout_ms);
    uint64_t v;
    if (fds[0].revents & POLLIN) {
      ssize_t n = read(wake_fd_, &v, sizeof(v));
      (void)n;
    }
    // A request made just before Stop() (a rank whose op failed, dumped and
    // is now tearing its group down) is still posted: the others dump only
    // if it reaches the store.
    stopping = stop_.load();
    if (!stopping && nfds == 2 && (fds[1].revents & POLLIN) &&
        read(fds[1].fd, &v, sizeof(v)) > 0) {
      AutoDumpFlightRecorders("SIGUSR1", /*force=*/true);
    }
    if (!store_ok) continue;
    try {
      if (request_.exchange(false)) {
        seen = store_->add(kRequestKey, 1);  // this rank has dumped already
      } else if (!stopping) {
        const int64_t now = store_->add(kRequestKey, 0);
        if (now > seen) {
          seen = now;
          AutoDumpFlightRecorders("requested by another rank", /*force=*/false);
        }
      }
    } catch (const std::exception&) {
      store_ok = false;  // the store is gone (the job is ending): stop polling
    }
  }
}

}  // namespace tpudist::collectives
