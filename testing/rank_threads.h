// Test harness: N ranks as threads of one process. Test-only (GoogleTest);
// not part of any installed library.
//
//   auto store = c10::make_intrusive<c10d::HashStore>();   // the caller's store
//   tpudist::test_support::RunRankThreads(4, [&](int rank) { ... store ... });
//
// Each rank runs body(rank) on its own thread. gtest assertions inside body
// report themselves (they are thread-safe); an exception escaping body is
// recorded as a failure naming the rank ("rank 2 threw: ..."). The harness
// waits at most `deadline` for all ranks: a rank still running then is a hang,
// and since a thread cannot be killed the process aborts with a message that
// names the ranks still running (ctest then reports a failure instead of
// waiting for its own timeout).
//
// Torch-free on purpose: the rendezvous store (a c10d::HashStore, an
// in-memory transport, ...) belongs to the caller and is captured by body.
// testing/device_mesh_ranks.h builds DeviceMesh ranks on top of this.
//
// Thread-safety: RunRankThreads may be called from any one thread at a time;
// body must be safe to run concurrently with itself.
#ifndef TPU_DIST_TESTING_RANK_THREADS_H_
#define TPU_DIST_TESTING_RANK_THREADS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace tpudist::test_support {

// One rank's escaped exception.
struct RankError {
  int rank = -1;
  std::string message;  // e.what()
};

// Runs body(rank) for rank in [0, world) on `world` threads and joins them.
// Returns the exceptions that escaped body, in rank order (each was also
// reported to gtest with ADD_FAILURE). Aborts the process if a rank is still
// running after `deadline` (see above).
// REQUIRES: world >= 1.
std::vector<RankError> RunRankThreads(int world, const std::function<void(int rank)>& body,
                                      absl::Duration deadline = absl::Seconds(300));

}  // namespace tpudist::test_support

#endif  // TPU_DIST_TESTING_RANK_THREADS_H_
