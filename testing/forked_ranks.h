// Ranks as forked processes, two ways. Test-only scaffolding; not part of any
// installed library.
//
// 1. RunForkedRanks (tests; target tpu_dist::testing, reports to GoogleTest):
//
//   std::vector<ChildResult> results = RunForkedRanks(
//       {0, 1, 2, 3}, [&](int rank, std::string* report) { ...; return 0; },
//       {.deadline = absl::Seconds(60)});
//
// Each child runs body(rank, &report) and exits with body's return value
// (an exception escaping body: its message on stderr, exit code 98); what
// body put in `report` comes back to the parent through a pipe. The parent
// waits at most `deadline` for every child; children still running then are
// killed with SIGKILL and reaped, so no call hangs and no child outlives it.
// A child also dies with SIGKILL if the parent dies (PR_SET_PDEATHSIG), so a
// test binary killed by ctest leaves no ranks behind.
//
// Fork before a test starts threads of its own where it can: a child keeps
// only the forking thread (libtorch's pools are rebuilt lazily). Children end
// with _exit: no atexit handlers, no gtest teardown, no stdio flush (write
// diagnostics to stderr, which is unbuffered).
//
// 2. ForkRanks / WaitForRanks (the bench/ programs; target
//    tpu_dist::testing_base, GoogleTest-free): the caller itself goes on as
//    rank 0, like real use (tpurun) without a launcher.
//
//   ForkedRanks ranks = ForkRanks(world);   // before any libtorch threads
//   ... every process runs the benchmark as ranks.rank ...
//   if (ranks.rank != 0) _exit(0);
//   absl::Status s = WaitForRanks(ranks, absl::Seconds(60));  // rank 0
//
// Fork before libtorch starts its thread pools (no at:: ops before
// ForkRanks): a forked child only keeps the calling thread.
//
// Thread-safety: call from one thread at a time (ForkRanks: the main thread).
#ifndef TPU_DIST_TESTING_FORKED_RANKS_H_
#define TPU_DIST_TESTING_FORKED_RANKS_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tpudist::test_support {

// How one child ended.
struct ChildResult {
  int rank = -1;
  pid_t pid = -1;
  bool exited = false;          // true: exit_code is valid
  int exit_code = -1;           // body's return value when exited
  int signal = 0;               // the signal that ended it when !exited
  bool killed_at_deadline = false;
  std::string report;           // what body wrote to *report
};

struct ForkOptions {
  absl::Duration deadline = absl::Seconds(120);
  // Runs in the parent once every child is forked (pids in rank order),
  // e.g. to kill one of them.
  std::function<void(const std::vector<pid_t>& pids)> on_started;
};

using ChildBody = std::function<int(int rank, std::string* report)>;

// Forks one child per entry of `ranks` and waits as described above.
// Returns one result per child, in the order of `ranks`. A failed fork is an
// ADD_FAILURE and a result with exit_code -1.
std::vector<ChildResult> RunForkedRanks(const std::vector<int>& ranks, const ChildBody& body,
                                        const ForkOptions& options = {});

// Ranks 0..world-1.
std::vector<ChildResult> RunForkedRanks(int world, const ChildBody& body,
                                        const ForkOptions& options = {});

// One int per child: the exit code, 128 + signal when a signal ended it, -1
// when the harness killed it at the deadline.
int ExitStatusCode(const ChildResult& result);

// What ForkRanks hands each process.
struct ForkedRanks {
  int rank = 0;                 // this process
  int world = 1;
  std::vector<pid_t> children;  // ranks 1..world-1, only filled in rank 0
};

// Forks world - 1 children (ranks 1..world-1); the caller stays rank 0.
// Children have stdout redirected to /dev/null when quiet_followers (their
// stderr stays, so a failing rank still explains itself).
// REQUIRES: world >= 1. Aborts if fork fails (a benchmark cannot go on).
ForkedRanks ForkRanks(int world, bool quiet_followers = true);

// Rank 0: waits for every child to exit, at most `timeout` in all. Children
// still running then are killed (SIGKILL). Error names each rank that was
// killed, exited non-zero or died on a signal.
absl::Status WaitForRanks(const ForkedRanks& ranks, absl::Duration timeout);

}  // namespace tpudist::test_support

#endif  // TPU_DIST_TESTING_FORKED_RANKS_H_
