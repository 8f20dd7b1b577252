// Faults of the service's host and of its port (issue 39, items 8 and 4):
//   * a frozen (SIGSTOPped) service host: a client's blocked call ends with
//     the heartbeat timeout, and every later call fails at once;
//   * a rank that never registers is named, within the registration timeout;
//   * strangers' idle connections cannot take the service's descriptors: the
//     listener keeps a reserve, survives EMFILE, and closes idle ones.
// The service runs in a child process (RunServeChild, a CoordinationChild
// role) so that it can be stopped, or given a small descriptor limit.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tpu_runtime/coordination/coordination_client.h"
#include "tpu_runtime/coordination/coordination_runtime.h"
#include "tpu_runtime/coordination/coordination_service.h"
#include "testing/coordination_child.h"
#include "tpu_runtime/coordination/service_listener.h"
#include "tpu_runtime/exit_codes.h"

namespace tpudist::tpu_runtime::coordination {

// Child role "serve" (declared and dispatched in coordination_store_test.cc):
// a CoordinationService with the options in the
// environment; writes its port to TPUDIST_COORD_PORT_FILE, then waits to be
// killed (at most 120 s).
int RunServeChild() {
  int world = 0, heartbeat_ms = 0, idle_ms = 0, nofile = 0;
  if (!absl::SimpleAtoi(test_support::EnvOr("TPUDIST_COORD_WORLD", ""), &world) ||
      !absl::SimpleAtoi(test_support::EnvOr("TPUDIST_COORD_HEARTBEAT_MS", ""),
                        &heartbeat_ms) ||
      !absl::SimpleAtoi(test_support::EnvOr("TPUDIST_COORD_IDLE_MS", "30000"), &idle_ms) ||
      !absl::SimpleAtoi(test_support::EnvOr("TPUDIST_COORD_NOFILE", "0"), &nofile)) {
    return 2;
  }
  const std::string log = test_support::EnvOr("TPUDIST_COORD_STDERR", "");
  if (!log.empty() && std::freopen(log.c_str(), "w", stderr) == nullptr) {
    return 2;
  }
  std::setvbuf(stderr, nullptr, _IONBF, 0);
  if (nofile > 0) {
    const rlimit rl{static_cast<rlim_t>(nofile), static_cast<rlim_t>(nofile)};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return 2;
  }
  ServiceOptions options;
  options.job_id = test_support::EnvOr("TPUDIST_COORD_JOB", "");
  options.num_tasks = world;
  options.heartbeat_timeout = absl::Milliseconds(heartbeat_ms);
  options.handshake_timeout = absl::Milliseconds(idle_ms);
  options.idle_connection_timeout = absl::Milliseconds(idle_ms);
  auto service = CoordinationService::Start(options);
  if (!service.ok()) {
    std::fprintf(stderr, "serve: %s\n", service.status().ToString().c_str());
    return 3;
  }
  const std::string path = test_support::EnvOr("TPUDIST_COORD_PORT_FILE", "");
  {
    std::ofstream out(path + ".tmp");
    out << (*service)->port() << "\n";
  }
  if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0) return 4;
  absl::SleepFor(absl::Seconds(120));
  return 5;
}

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using test_support::SpawnChild;
using test_support::WaitChild;
using test_support::WaitFor;

constexpr char kJob[] = "faults-test";

// A service host in a child process; killed and reaped by the destructor.
class ServeChild {
 public:
  explicit ServeChild(std::map<std::string, std::string> env) {
    const std::string base = absl::StrCat(::testing::TempDir(), "/serve-",
                                          getpid(), "-", counter_++);
    port_file_ = base + ".port";
    log_file_ = base + ".log";
    env["TPUDIST_COORD_JOB"] = kJob;
    env["TPUDIST_COORD_PORT_FILE"] = port_file_;
    env["TPUDIST_COORD_STDERR"] = log_file_;
    pid_ = SpawnChild("serve", env);
    WaitFor(
        [&] {
          std::ifstream in(port_file_);
          return static_cast<bool>(in >> port_);
        },
        absl::Seconds(30));
  }
  ~ServeChild() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);  // also ends a stopped process
      WaitChild(pid_, absl::Seconds(10));
    }
    std::remove(port_file_.c_str());
    std::remove(log_file_.c_str());
  }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::string Log() const {
    std::ifstream in(log_file_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  static inline int counter_ = 0;
  pid_t pid_ = -1;
  int port_ = 0;
  std::string port_file_, log_file_;
};

std::unique_ptr<CoordinationClient> ConnectTask(const std::string& address,
                                                int task,
                                                absl::Duration timeout) {
  ClientOptions options;
  options.connect_timeout = timeout;
  auto client = CoordinationClient::Connect(address, kJob, task, options);
  if (!client.ok()) {
    ADD_FAILURE() << client.status();
    return nullptr;
  }
  if (absl::Status s = (*client)->Register(); !s.ok()) {
    ADD_FAILURE() << s;
    return nullptr;
  }
  return *std::move(client);
}

// ---- item 8: a frozen service host ----------------------------------------

// The service's host is SIGSTOPped while a client blocks in Get: the call
// ends with Unavailable within the heartbeat timeout (+ margin), not at its
// own 30 s deadline; later calls (Set, ShutdownTask) fail at once.
// TPUDIST_TEST_HEARTBEAT_MS overrides the 1 s timeout (to measure others).
TEST(ServiceHostFrozenTest, BlockedCallsEndWithinTheHeartbeatTimeout) {
  const int heartbeat_ms =
      std::stoi(test_support::EnvOr("TPUDIST_TEST_HEARTBEAT_MS", "1000"));
  ServeChild host({{"TPUDIST_COORD_WORLD", "2"},
                   {"TPUDIST_COORD_HEARTBEAT_MS", absl::StrCat(heartbeat_ms)}});
  ASSERT_GT(host.pid(), 0);
  ASSERT_GT(host.port(), 0) << host.Log();
  auto client = ConnectTask(host.address(), 0, absl::Seconds(10));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Set("before", "1").ok());

  absl::Status got;
  absl::Time returned;
  std::thread blocked([&] {
    got = client->Get("never-set", absl::Seconds(30)).status();
    returned = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(300));  // the Get is at the service
  ASSERT_EQ(kill(host.pid(), SIGSTOP), 0);
  const absl::Time stopped = absl::Now();
  blocked.join();
  const absl::Duration detect = returned - stopped;
  std::printf("frozen service host (heartbeat timeout %d ms): blocked Get "
              "ended %.2f s after SIGSTOP\n",
              heartbeat_ms, absl::ToDoubleSeconds(detect));
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable) << got;
  EXPECT_THAT(got.message(),
              AllOf(HasSubstr("Get('never-set')"),
                    HasSubstr("no contact with the coordination service")));
  EXPECT_LE(detect, absl::Milliseconds(heartbeat_ms) + absl::Seconds(1));
  EXPECT_FALSE(client->health().ok());

  // Every later call fails at once with the same cause.
  absl::Time t = absl::Now();
  const absl::Status set = client->Set("after", "1");
  EXPECT_EQ(set.code(), absl::StatusCode::kUnavailable) << set;
  EXPECT_THAT(set.message(), HasSubstr("no contact"));
  EXPECT_LT(absl::Now() - t, absl::Milliseconds(100));
  t = absl::Now();
  client->Shutdown().IgnoreError();
  EXPECT_LT(absl::Now() - t, absl::Milliseconds(500));
}

// ---- item 8: a rank that never registers ----------------------------------

ServiceOptions ShortRegistration(int num_tasks, absl::Duration timeout) {
  ServiceOptions options;
  options.job_id = kJob;
  options.num_tasks = num_tasks;
  options.registration_timeout = timeout;
  return options;
}

// Ranks 0 and 2 register, rank 1 never does: the startup barrier ends at the
// registration timeout (1 s here) with a job error naming rank 1, blamed on
// it, instead of at the barrier's 30 s.
TEST(RegistrationDeadlineTest, ARankThatNeverRegistersIsNamed) {
  const absl::Time start = absl::Now();
  auto service =
      CoordinationService::Start(ShortRegistration(3, absl::Seconds(1)));
  ASSERT_TRUE(service.ok()) << service.status();
  auto c0 = ConnectTask((*service)->address(), 0, absl::Seconds(10));
  auto c2 = ConnectTask((*service)->address(), 2, absl::Seconds(10));
  ASSERT_TRUE(c0 && c2);
  const absl::Status s = c0->Barrier("tpudist/startup", absl::Seconds(30));
  const absl::Duration took = absl::Now() - start;
  std::printf("unregistered rank named %.2f s after the service started "
              "(registration timeout 1 s)\n",
              absl::ToDoubleSeconds(took));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("rank 1 never registered"),
                                 HasSubstr("TPU_DIST_REGISTRATION_TIMEOUT"),
                                 HasSubstr("2 of 3 ranks registered")));
  EXPECT_LT(took, absl::Seconds(3));
  EXPECT_EQ((*service)->state().JobErrorTask(), 1);
  ASSERT_TRUE(WaitFor([&] { return !c2->health().ok(); }, absl::Seconds(2)));
  EXPECT_EQ(c2->job_error_task(), 1);
  // A late rank 1 is refused: the job already failed.
  auto late = CoordinationClient::Connect((*service)->address(), kJob, 1);
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE((*late)->Register().ok());
}

// The same through StartOrConnect: rank 0's startup fails naming rank 1, and
// its exit code says another rank failed.
TEST(RegistrationDeadlineTest, StartOrConnectFailsNamingTheMissingRank) {
  RankInfo info;
  info.world_size = 2;
  info.master_addr = "localhost";
  info.master_port = 0;
  info.job_id = "registration-test";
  RuntimeOptions options;
  options.service.registration_timeout = absl::Seconds(1);
  options.startup_barrier_timeout = absl::Seconds(30);
  const absl::Time start = absl::Now();
  auto runtime = StartOrConnect(info, options);
  ASSERT_FALSE(runtime.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_THAT(runtime.status().message(), HasSubstr("rank 1 never registered"));
  EXPECT_EQ(StartupFailureExitCode(runtime.status()), kPeerFailureExitCode);
  EXPECT_EQ(StartupFailureExitCode(absl::InternalError("own")), 1);
}

// A barrier that times out before the registration deadline says which of
// its missing tasks never registered.
TEST(RegistrationDeadlineTest, BarrierTimeoutNamesTasksThatNeverRegistered) {
  auto service = CoordinationService::Start(
      ShortRegistration(2, absl::InfiniteDuration()));
  ASSERT_TRUE(service.ok()) << service.status();
  auto c0 = ConnectTask((*service)->address(), 0, absl::Seconds(10));
  ASSERT_NE(c0, nullptr);
  const absl::Status s = c0->Barrier("b", absl::Milliseconds(300));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr("missing tasks {1} (never registered: {1})"));
}

TEST(RegistrationDeadlineTest, TimeoutFromTheEnvironment) {
  auto parsed = WithTimeoutsFromEnv({}, {{"TPU_DIST_REGISTRATION_TIMEOUT", "90s"}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->service.registration_timeout, absl::Seconds(90));
  parsed = WithTimeoutsFromEnv({}, {{"TPU_DIST_REGISTRATION_TIMEOUT", "45"}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->service.registration_timeout, absl::Seconds(45));
  parsed = WithTimeoutsFromEnv({}, {});
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->service.registration_timeout, absl::Seconds(60));
  for (const char* bad : {"0", "-5s", "inf", "soon", "0s"}) {
    parsed = WithTimeoutsFromEnv({}, {{"TPU_DIST_REGISTRATION_TIMEOUT", bad}});
    EXPECT_TRUE(absl::IsInvalidArgument(parsed.status())) << bad;
    EXPECT_THAT(parsed.status().message(),
                HasSubstr("TPU_DIST_REGISTRATION_TIMEOUT"));
  }
}

// ---- item 4: strangers' connections ---------------------------------------

// Opens a TCP connection to 127.0.0.1:port that sends nothing; -1 on error.
int ConnectRaw(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed `fd` (reads what it sent, e.g. its HTTP/2
// settings, until end of stream or a reset).
bool ClosedByPeer(int fd) {
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) continue;
    if (n == 0) return true;
    return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }
}

// The service host has `ulimit -n` 128. 300 strangers connect and send
// nothing: the task already connected keeps working, a task that connects
// after them gets in, the listener logs its refusals with the descriptor
// counts, and every stranger's connection is closed within the idle timeout
// (1 s here) + margin. (libgrpc 1.51's own acceptor stops accepting for good
// at the first EMFILE, and keeps silent connections for 120 s.)
TEST(ServiceConnectionsTest, IdleStrangersDoNotStarveTheService) {
  ServeChild host({{"TPUDIST_COORD_WORLD", "2"},
                   {"TPUDIST_COORD_HEARTBEAT_MS", "10000"},
                   {"TPUDIST_COORD_IDLE_MS", "1000"},
                   {"TPUDIST_COORD_NOFILE", "128"}});
  ASSERT_GT(host.port(), 0) << host.Log();
  auto c0 = ConnectTask(host.address(), 0, absl::Seconds(10));
  ASSERT_NE(c0, nullptr);

  std::vector<int> strangers;
  for (int i = 0; i < 300; ++i) {
    const int fd = ConnectRaw(host.port());
    if (fd >= 0) strangers.push_back(fd);
  }
  EXPECT_GE(strangers.size(), 250u);
  const absl::Time flooded = absl::Now();
  EXPECT_TRUE(c0->Set("k", "v").ok());
  auto got = c0->Get("k", absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");

  // A rank connecting after the flood gets in.
  auto c1 = ConnectTask(host.address(), 1, absl::Seconds(10));
  ASSERT_NE(c1, nullptr) << host.Log();
  EXPECT_TRUE(c1->Set("k1", "v1").ok());

  // Every stranger is closed by the server: the ones over the descriptor
  // budget at once, the others after the idle timeout.
  std::vector<bool> closed(strangers.size(), false);
  size_t num_closed = 0;
  WaitFor(
      [&] {
        for (size_t i = 0; i < strangers.size(); ++i) {
          if (!closed[i] && ClosedByPeer(strangers[i])) {
            closed[i] = true;
            ++num_closed;
          }
        }
        return num_closed == strangers.size();
      },
      absl::Seconds(8));
  std::printf("%zu of %zu idle strangers closed %.2f s after the flood\n",
              num_closed, strangers.size(),
              absl::ToDoubleSeconds(absl::Now() - flooded));
  EXPECT_EQ(num_closed, strangers.size());
  for (int fd : strangers) close(fd);
  EXPECT_THAT(host.Log(), AllOf(HasSubstr("refused a connection from ipv4:"),
                                HasSubstr("file descriptors open (ulimit -n)")));
  // The real tasks were never idle (their watchers): still connected.
  EXPECT_TRUE(c0->health().ok()) << c0->health();
  EXPECT_TRUE(c0->Set("k2", "v2").ok());
  c1->Shutdown().IgnoreError();
  c0->Shutdown().IgnoreError();
}

// A client that stays idle past the idle-connection timeout (no watcher, not
// registered) loses its connection to the server's idle check and
// reconnects on its next call, which succeeds.
TEST(ServiceListenerTest, IdleClientReconnectsOnItsNextCall) {
  ServiceOptions options;
  options.job_id = kJob;
  options.num_tasks = 1;
  options.idle_connection_timeout = absl::Milliseconds(300);
  auto service = CoordinationService::Start(options);
  ASSERT_TRUE(service.ok()) << service.status();
  ClientOptions client_options;
  client_options.watch_errors = false;
  auto client = CoordinationClient::Connect((*service)->address(), kJob, 0,
                                            client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Set("a", "1").ok());
  absl::SleepFor(absl::Seconds(1));  // the server closed the idle connection
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE((*client)->Set("b", "2").ok());
    absl::SleepFor(absl::Milliseconds(500));
  }
  EXPECT_EQ(*(*client)->TryGet("b"), "2");
}

// The service's host nears `ulimit -n` (here: files this process opened):
// rank 0's stderr says so, with the counts, within a check interval.
TEST(ServiceListenerTest, WarnsWhenDescriptorsRunLow) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  ServiceOptions options;
  options.job_id = kJob;
  options.num_tasks = 1;
  auto service = CoordinationService::Start(options);
  ASSERT_TRUE(service.ok()) << service.status();
  const int base = CountOpenFds();
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(base + 40);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> files;
  while (CountOpenFds() < base + 36) {
    const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
    files.push_back(fd);
  }
  ::testing::internal::CaptureStderr();
  absl::SleepFor(absl::Milliseconds(2500));  // > one check interval (1 s)
  const std::string log = ::testing::internal::GetCapturedStderr();
  for (int fd : files) close(fd);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_THAT(log, AllOf(HasSubstr("file descriptors open (ulimit -n)"),
                         HasSubstr("Too many open files"),
                         HasSubstr(absl::StrCat("port ", (*service)->port()))));
}

TEST(ServiceListenerTest, DefaultFdReserveAndCount) {
  EXPECT_EQ(DefaultFdReserve(1024), 256);
  EXPECT_EQ(DefaultFdReserve(40), 16);
  EXPECT_EQ(DefaultFdReserve(1 << 20), 4096);
  EXPECT_GT(CountOpenFds(), 2);  // stdin, stdout, stderr at least
}

}  // namespace
}  // namespace tpudist::tpu_runtime::coordination
