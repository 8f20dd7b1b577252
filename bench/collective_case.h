// One case of collectives_bench: its tensors (nccl-tests sizes, bench_math.h)
// and the op call on a process group, ours or Gloo.
//
// Thread-safety: none needed; each rank process uses its own Buffers.
#ifndef TPU_DIST_BENCH_COLLECTIVE_CASE_H_
#define TPU_DIST_BENCH_COLLECTIVE_CASE_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <chrono>
#include <vector>

#include "bench/bench_math.h"
#include "torch/csrc/distributed/c10d/Backend.hpp"

namespace tpudist::bench {

// The tensors of one case. in/out: [numel] or [numel / world] as the op
// needs (numel = bytes / element size).
struct Buffers {
  at::Tensor in, out;
  std::vector<at::Tensor> out_views;  // all_gather for Gloo: W x [numel / W]
  std::vector<at::Tensor> in_views;   // reduce_scatter for Gloo: W x [numel / W]
};

// all_gather: in [numel / W] -> out [numel]; reduce_scatter: in [numel] ->
// out [numel / W]; all_to_all: [numel] -> [numel]; all_reduce, broadcast: in
// place on `in`; memcpy: in -> out. REQUIRES: bytes a multiple of the element
// size (and, for the split ops, of W elements).
Buffers MakeBuffers(CollectiveOp op, int64_t bytes, at::ScalarType dtype, int world, int rank);

// Runs one op of `pg` (ours or Gloo) on `b` and waits. Every op says it is
// waited on at once (asyncOp = false), as Python's async_op=False does: that
// lets tpu_dist run small ops on the calling thread (Gloo ignores the flag).
// Gloo's all_gather / reduce_scatter take the views; ours the flat tensors.
void RunOp(c10d::Backend& pg, bool is_gloo, CollectiveOp op, Buffers& b);

// A barrier waited on at once (asyncOp = false, like RunOp's ops): run on
// the calling thread, so the timed loop does not start behind a worker-run op.
void WaitedBarrier(c10d::Backend& pg);

// Runs 8-byte all_reduces on `pg` until `duration` has passed on rank 0
// (each op carries rank 0's "go on" flag, so every rank stops after the
// same op) and returns how many ran. Collective. Lets the group's waits
// settle after start-up: while 16 ranks load libraries their yields are
// slow, which closes the adaptive yield stage for up to a second
// (collectives/shm/wait.h), and a first case timed then measures start-up.
int64_t SettleGroup(c10d::Backend& pg, int rank, std::chrono::milliseconds duration);

}  // namespace tpudist::bench

#endif  // TPU_DIST_BENCH_COLLECTIVE_CASE_H_
