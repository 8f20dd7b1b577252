// RunRailPipeline: the chunk schedule of HierarchicalBackend's multi-rail
// ops (hierarchical_backend_rails.cc). A payload cut into K chunks goes
// through three stages per chunk: an intra-host shm step (`before`), the
// rail's TCP step (`tcp`) and a second shm step (`after`). The shm stages run
// on the calling thread, the TCP stage on one helper thread, so the network
// transfer of chunk k overlaps the shm work of chunks k - 1 and k + 1:
//
//   caller:  before(0) before(1) after(0) before(2) after(1) ... after(K-1)
//   helper:            tcp(0)    tcp(1)   tcp(2)    ...
//
// tcp(k) starts once before(k) has returned; after(k) once tcp(k) has. The
// order of the shm steps and that of the TCP steps depend only on K, so every
// rank of a host issues the same shm ops and every rank of a rail the same
// TCP ops, in the same order: no rank waits for a step a peer never issues.
// With K == 1 the stages run one after the other on the calling thread.
//
// Failure: the first failing stage wins. A failing shm stage calls
// abort_tcp (which must make a blocked tcp stage return promptly), a failing
// TCP stage abort_shm; both threads stop at their next step and the result
// names the stage that failed first (the other only saw the abort).
//
// Thread-safety: the stages run on two threads, but each stage function only
// on one; they must not share unsynchronised state other than through the
// data dependencies above (chunk k's buffers are handed from stage to stage).
// abort_shm / abort_tcp may run on either thread.
#ifndef TPU_DIST_COLLECTIVES_HIERARCHICAL_BACKEND_PIPELINE_H_
#define TPU_DIST_COLLECTIVES_HIERARCHICAL_BACKEND_PIPELINE_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tpudist::collectives {

struct RailStages {
  std::function<absl::Status(int64_t chunk)> before;  // shm; may be empty (no-op)
  std::function<absl::Status(int64_t chunk)> tcp;
  std::function<absl::Status(int64_t chunk)> after;   // shm; may be empty (no-op)
  std::function<void(const absl::Status&)> abort_shm;
  std::function<void(const absl::Status&)> abort_tcp;
};

struct RailPipelineResult {
  absl::Status status;     // OK, or the first failure
  bool tcp_failed = false;  // whether that failure came from the tcp stage
};

// Runs chunks 0..chunks-1 through `stages`. Waits between the threads are
// bounded by `deadline` (plus a grace second: each stage is itself bounded by
// the deadline and reports its own DeadlineExceeded first).
// REQUIRES: chunks >= 1; stages.tcp set.
RailPipelineResult RunRailPipeline(int64_t chunks, const RailStages& stages,
                                   absl::Time deadline);

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_HIERARCHICAL_BACKEND_PIPELINE_H_
