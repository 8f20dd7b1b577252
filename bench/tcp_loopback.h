// The loopback TCP bandwidth of this machine, measured in the benchmark's own
// run: the limit for collectives between emulated hosts (every cross-host
// byte crosses a loopback socket, copied by the kernel on both sides).
//
//   absl::StatusOr<TcpLoopback> bw = MeasureTcpLoopback(16 << 20, 8);
//
// One socket pair on 127.0.0.1 (TCP_NODELAY, kernel buffer autotuning, the
// same socket setup as collectives/tcp), a writer thread streaming `repeats`
// writes of `bytes` while the calling thread reads them; one unmeasured
// round first (slow start, page faults of the buffers).
//
// Thread-safety: starts and joins one thread of its own; call it while no
// other work runs (rank 0 after the collectives, the other ranks gone), or
// it measures the contention instead.
#ifndef TPU_DIST_BENCH_TCP_LOOPBACK_H_
#define TPU_DIST_BENCH_TCP_LOOPBACK_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace tpudist::bench {

struct TcpLoopback {
  int64_t bytes = 0;           // per write
  int repeats = 0;             // timed writes
  double seconds_per_copy = 0;  // mean time to move `bytes` through the pair
  double gbytes_per_s = 0;     // bytes / seconds_per_copy / 1e9
};

// REQUIRES: bytes > 0, repeats > 0. Errors: socket set-up or I/O failures,
// each bounded by a 60 s deadline.
absl::StatusOr<TcpLoopback> MeasureTcpLoopback(int64_t bytes, int repeats);

}  // namespace tpudist::bench

#endif  // TPU_DIST_BENCH_TCP_LOOPBACK_H_
