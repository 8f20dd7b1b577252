// Forked ranks for the benchmark binaries: one process per rank, like real
// use (tpurun), without a launcher.
//
//   ForkedRanks ranks = ForkRanks(world);   // before any libtorch threads
//   ... every process runs the benchmark as ranks.rank ...
//   if (ranks.rank != 0) _exit(0);
//   absl::Status s = WaitForRanks(ranks, absl::Seconds(60));  // rank 0
//
// Fork before libtorch starts its thread pools (no at:: ops before
// ForkRanks): a forked child only keeps the calling thread.
//
// Thread-safety: call from the main thread only.
#ifndef TPU_DIST_BENCH_FORKED_RANKS_H_
#define TPU_DIST_BENCH_FORKED_RANKS_H_

#include <sys/types.h>

#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tpudist::bench {

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

}  // namespace tpudist::bench

#endif  // TPU_DIST_BENCH_FORKED_RANKS_H_
