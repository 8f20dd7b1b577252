// Pure arithmetic of the benchmarks: bandwidth conventions, sweep sizes,
// iteration counts, and the model FLOPs of a decoder training step. No I/O,
// no tensors; unit-tested in bench_test.cc.
//
// Bandwidth follows the nccl-tests conventions (PERFORMANCE.md there):
//   size    = bytes of the largest buffer a rank touches: the tensor of
//             all_reduce / broadcast, the gathered output of all_gather, the
//             full input of reduce_scatter, the whole send buffer of all_to_all
//   algBw   = size / time
//   busBw   = algBw * factor, where factor is the fraction of `size` each
//             rank must move over the slowest link of an optimal algorithm:
//               all_reduce                   2 (n - 1) / n
//               all_gather, reduce_scatter,
//               all_to_all                   (n - 1) / n
//               broadcast, memcpy            1
// busBw is what to compare with the machine's memory (memcpy) bandwidth.
//
// Thread-safety: pure functions, safe from any thread.
#ifndef TPU_DIST_BENCH_BENCH_MATH_H_
#define TPU_DIST_BENCH_BENCH_MATH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tpudist::bench {

enum class CollectiveOp { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kAllToAll, kMemcpy };

// "all_reduce", "all_gather", ... "memcpy".
std::string OpName(CollectiveOp op);
// Inverse of OpName; nullopt for an unknown name.
std::optional<CollectiveOp> ParseOp(const std::string& name);

// The busBw / algBw factor above. REQUIRES: world >= 1.
double BusBwFactor(CollectiveOp op, int world);

// Bytes per second; 0 when seconds <= 0.
double AlgBw(int64_t bytes, double seconds);
double BusBw(CollectiveOp op, int world, int64_t bytes, double seconds);

// min_bytes, min_bytes * step, ... up to and including max_bytes (the last
// entry is max_bytes even when it is not on the geometric grid).
// REQUIRES: 1 <= min_bytes <= max_bytes, step >= 2.
std::vector<int64_t> SweepSizes(int64_t min_bytes, int64_t max_bytes, int64_t step);

// `size` rounded down to a multiple of world * elem_bytes, at least that
// (every rank gets the same whole number of elements).
// REQUIRES: world >= 1, elem_bytes >= 1.
int64_t RoundToWorld(int64_t size, int world, int64_t elem_bytes);

// Timed iterations for one benchmark: enough to move about `budget_bytes`,
// clamped to [min_iters, max_iters].
int64_t IterationsFor(int64_t bytes, int64_t budget_bytes, int64_t min_iters, int64_t max_iters);

// "8B", "4KiB", "16MiB", "1GiB" (exact powers of 1024 only; else bytes "B").
std::string SizeName(int64_t bytes);

// Model FLOPs of one forward+backward step of a decoder (the usual 6ND
// estimate plus the attention score/value matmuls):
//   6 * matmul_params * tokens  +  sum over layers of 12 * B * H * S^2 * D_l
// (forward 2 matmuls * 2 FLOPs = 4, backward twice that). matmul_params
// counts every weight used in a matmul once (a tied lm_head counts again,
// being a second matmul); head_dims has one entry per layer.
double DecoderStepFlops(double matmul_params, int64_t batch, int64_t seq, int64_t heads,
                        const std::vector<int64_t>& head_dims);

}  // namespace tpudist::bench

#endif  // TPU_DIST_BENCH_BENCH_MATH_H_
