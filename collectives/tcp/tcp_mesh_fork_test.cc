// TcpMesh and the ring algorithms across forked processes rendezvousing
// through a c10d::FileStore: a killed peer, a handshake mismatch, a peer that
// never shows up. Each child reports its status message back through a pipe;
// the parent waits with a deadline and SIGKILLs stragglers, so no test hangs.

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectives/tcp/ring_algorithms.h"
#include "collectives/tcp/tcp_mesh.h"
#include "testing/tcp_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/forked_ranks.h"

namespace tpudist::collectives::tcp {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

// What a child reported: its exit status and the text it wrote.
struct ChildResult {
  int rank = -1;
  bool exited = false;  // false: killed by a signal (or by the watchdog)
  int exit_code = -1;
  std::string report;
};

// Runs body(rank) in forked children (ranks listed in `ranks`) on
// testing/forked_ranks.h. A child sends body's returned string back and exits
// 0. The parent collects everything within `limit`, killing what is left
// after it (exit_code -signal then).
std::vector<ChildResult> RunForked(const std::vector<int>& ranks,
                                   const std::function<std::string(int rank)>& body,
                                   absl::Duration limit) {
  ::tpudist::test_support::ForkOptions options;
  options.deadline = limit;
  std::vector<ChildResult> results;
  for (const ::tpudist::test_support::ChildResult& c : ::tpudist::test_support::RunForkedRanks(
           ranks,
           [&body](int rank, std::string* report) {
             *report = body(rank);
             return 0;
           },
           options)) {
    results.push_back(
        ChildResult{c.rank, c.exited, c.exited ? c.exit_code : -c.signal, c.report});
  }
  return results;
}

class TcpMeshForkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tcp_fork_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string StorePath() const { return dir_ + "/store"; }

  std::string dir_;
};

std::string StatusText(const absl::Status& s) {
  return absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
}

// Rank 3 of 4 dies (SIGKILL) right after the mesh is up. The survivors run a
// ring all-reduce with a 20 s deadline; each must fail well before it, with
// Unavailable, and name rank 3 (directly, or in its list of closed peers when
// it failed because a neighbour aborted first).
TEST_F(TcpMeshForkTest, KilledPeerFailsSurvivorsFastNamingIt) {
  constexpr int kWorld = 4;
  const std::string path = StorePath();
  auto results = RunForked(
      {0, 1, 2, 3},
      [&](int rank) -> std::string {
        c10d::FileStore store(path, -1);
        TcpMeshOptions options;
        options.group_key = "killed";
        options.connect_timeout = absl::Seconds(20);
        auto mesh = TcpMesh::Connect(store, rank, kWorld, options);
        if (!mesh.ok()) return "CONNECT " + StatusText(mesh.status());
        store.add("connected", 1);
        if (rank == 3) raise(SIGKILL);
        // Wait until rank 3 is surely gone: its connected count is in.
        store.wait({"connected"}, std::chrono::seconds(20));
        while (store.add("connected", 0) < kWorld) absl::SleepFor(absl::Milliseconds(5));
        absl::SleepFor(absl::Milliseconds(100));
        std::vector<float> data(1 << 20, 1.f);  // [1M]
        const absl::Time start = absl::Now();
        absl::Status s = RingAllReduce(**mesh, test_support::AsBytes(data), sizeof(float),
                                       test_support::SumReducer<float>(), start + absl::Seconds(20));
        return absl::StrCat("elapsed_ms=", absl::ToInt64Milliseconds(absl::Now() - start), " ",
                            StatusText(s));
      },
      absl::Seconds(60));
  ASSERT_EQ(results.size(), 4u);
  EXPECT_FALSE(results[3].exited);
  EXPECT_EQ(results[3].exit_code, -SIGKILL);
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r, ": ", results[r].report));
    std::printf("[killed peer] rank %d: %s\n", r, results[r].report.c_str());
    EXPECT_TRUE(results[r].exited);
    EXPECT_THAT(results[r].report, HasSubstr("UNAVAILABLE"));
    EXPECT_THAT(results[r].report, HasSubstr("rank 3"));
    const int elapsed = std::atoi(results[r].report.c_str() + std::strlen("elapsed_ms="));
    EXPECT_LT(elapsed, 10000);
  }
}

// Same group key, different world sizes: both sides reject the handshake.
TEST_F(TcpMeshForkTest, HandshakeMismatchIsRejected) {
  const std::string path = StorePath();
  auto results = RunForked(
      {0, 1},
      [&](int rank) -> std::string {
        c10d::FileStore store(path, -1);
        TcpMeshOptions options;
        options.group_key = "mismatch";
        options.connect_timeout = absl::Seconds(5);
        return StatusText(TcpMesh::Connect(store, rank, rank == 0 ? 2 : 3, options).status());
      },
      absl::Seconds(30));
  for (const ChildResult& r : results) {
    std::printf("[mismatch] rank %d: %s\n", r.rank, r.report.c_str());
    EXPECT_TRUE(r.exited);
    EXPECT_THAT(r.report, HasSubstr("FAILED_PRECONDITION"));
    EXPECT_THAT(r.report, HasSubstr("world size"));
  }
}

// Ranks 0 and 1 of 3 start; rank 2 never does. Both fail at the 2 s connect
// timeout naming rank 2.
TEST_F(TcpMeshForkTest, ConnectTimesOutWhenAPeerNeverShowsUp) {
  const std::string path = StorePath();
  auto results = RunForked(
      {0, 1},
      [&](int rank) -> std::string {
        c10d::FileStore store(path, -1);
        TcpMeshOptions options;
        options.group_key = "absent";
        options.connect_timeout = absl::Seconds(2);
        const absl::Time start = absl::Now();
        absl::Status s = TcpMesh::Connect(store, rank, 3, options).status();
        return absl::StrCat("elapsed_ms=", absl::ToInt64Milliseconds(absl::Now() - start), " ",
                            StatusText(s));
      },
      absl::Seconds(30));
  for (const ChildResult& r : results) {
    std::printf("[absent] rank %d: %s\n", r.rank, r.report.c_str());
    EXPECT_TRUE(r.exited);
    EXPECT_THAT(r.report, HasSubstr("DEADLINE_EXCEEDED"));
    EXPECT_THAT(r.report, HasSubstr("peer rank(s) 2 did not connect"));
    const int elapsed = std::atoi(r.report.c_str() + std::strlen("elapsed_ms="));
    EXPECT_GE(elapsed, 1900);
    EXPECT_LT(elapsed, 8000);
  }
}

}  // namespace
}  // namespace tpudist::collectives::tcp
