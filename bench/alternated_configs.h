// Shared scaffolding of the benchmarks that compare configurations in ONE
// run (shm_sync_bench, pg_options_bench): W forked ranks time each
// configuration round by round, alternated, so every configuration sees the
// same placement of ranks on cores (on the 2-core KVM box a whole run lands
// in a fast or a slow mode up to 2x apart; bench/README.md).
//
//   AlternatedFlags flags;
//   if (!ParseAlternatedFlags(argc, argv, &flags)) { usage; return 2; }
//   return RunForkedRanks("my_bench", flags, [&](int rank, const std::string& dir,
//                                                const std::string& job_id) { ... });
//
// Thread-safety: call from the main thread, before libtorch starts threads
// (the ranks are forked).
#ifndef TPU_DIST_BENCH_ALTERNATED_CONFIGS_H_
#define TPU_DIST_BENCH_ALTERNATED_CONFIGS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tpudist::bench {

struct AlternatedFlags {
  int world = 2;
  int64_t bytes = 8;  // a multiple of 4 (fp32)
  int64_t ops = 50000;  // per round and configuration
  int rounds = 9;
};

// Parses --world=N --bytes=N --ops=N --rounds=N (every value > 0, bytes a
// multiple of 4) into *flags; false on anything else.
bool ParseAlternatedFlags(int argc, char** argv, AlternatedFlags* flags);

// Forks flags.world ranks (this process goes on as rank 0) and runs
// body(rank, dir, job_id) in each: `dir` a fresh scratch directory (for a
// FileStore), `job_id` unique to this run (shm names). Rank 0 waits up to 10
// minutes for the others, removes `dir` and its "store" file, and returns
// body's result (1 if a rank failed); the others _exit with theirs.
int RunForkedRanks(const std::string& name, const AlternatedFlags& flags,
                   const std::function<int(int rank, const std::string& dir,
                                           const std::string& job_id)>& body);

// flags.rounds rounds, each calling time_round(c) for c = 0 .. configs - 1
// in turn; returns [configs][rounds] of what it returned (seconds per op).
std::vector<std::vector<double>> AlternateRounds(const AlternatedFlags& flags, int configs,
                                                 const std::function<double(int c)>& time_round);

// Prints "<what>, world W, N ops x R rounds alternated; load average
// <load_before> -> <now>; us per op", then one line per configuration: the
// median and the min over rounds of `seconds[c]` in us, and the median over
// configuration 0's.
void PrintConfigTable(const std::string& what, const AlternatedFlags& flags, double load_before,
                      const std::vector<std::string>& names,
                      const std::vector<std::vector<double>>& seconds);

}  // namespace tpudist::bench

#endif  // TPU_DIST_BENCH_ALTERNATED_CONFIGS_H_
