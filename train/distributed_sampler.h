// DistributedSampler: which dataset rows each rank reads in each epoch, with
// the semantics of torch.utils.data.DistributedSampler:
//
//   1. Every epoch starts from a permutation of [0, n): the identity when
//      shuffle is off, else a Fisher-Yates shuffle driven by a SplitMix64
//      stream seeded from (seed, epoch). Same (seed, epoch) -> same order on
//      every rank and in every run; a new epoch -> a new order.
//   2. The permutation is cut to a multiple of world_size:
//        drop_last = true : total = floor(n / world) * world (tail dropped);
//        drop_last = false: total = ceil(n / world) * world, padded by
//                           repeating the permutation from its start.
//   3. Rank r takes positions r, r + world, r + 2*world, ... of that list,
//      so every rank gets num_samples() = total / world rows, the shards
//      are disjoint (with drop_last, or when world divides n), and together
//      they cover every row (without drop_last).
//
// The shuffle is ours, not torch.randperm's: orders match torch's
// *properties*, not its exact sequence.
//
// Batching and resume: a rank's epoch is its index list cut into batches of
// `batch_size` (the last batch is partial unless drop_last_batch). Every
// rank has the same number of batches, so collectives stay in step.
// After a failure, a run resumes with SetEpoch(e) and
// IndicesFromStep(s, batch_size), where s is the number of batches already
// consumed in epoch e; the result is exactly the suffix of the uninterrupted
// epoch.
//
// Value type, no I/O; const methods are thread-safe, SetEpoch is not.
#ifndef TPU_DIST_TRAIN_DISTRIBUTED_SAMPLER_H_
#define TPU_DIST_TRAIN_DISTRIBUTED_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace tpudist::train {

struct SamplerOptions {
  int64_t dataset_size = 0;  // n >= 1
  int world_size = 1;        // >= 1
  int rank = 0;              // 0 <= rank < world_size
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;  // drop the tail so shards are disjoint
};

// Pure: the epoch's permutation of [0, n) (step 1 above).
std::vector<int64_t> EpochPermutation(int64_t n, bool shuffle, uint64_t seed,
                                      int64_t epoch);

// Pure: rows per rank (step 2 above). 0 when drop_last and n < world.
int64_t SamplesPerRank(int64_t n, int world_size, bool drop_last);

// Pure: number of batches of `batch_size` in `num_samples` rows.
int64_t NumBatches(int64_t num_samples, int64_t batch_size,
                   bool drop_last_batch);

class DistributedSampler {
 public:
  // InvalidArgument (naming the value) for n < 1, world < 1, rank outside
  // [0, world), or drop_last with n < world (every shard would be empty).
  static absl::StatusOr<DistributedSampler> Create(
      const SamplerOptions& options);

  // Selects the epoch's order. Call before each epoch, as with torch.
  void SetEpoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  int64_t num_samples() const { return num_samples_; }  // per rank
  int64_t total_size() const { return num_samples_ * options_.world_size; }
  const SamplerOptions& options() const { return options_; }

  // This rank's rows for the current epoch, in reading order.
  std::vector<int64_t> Indices() const;

  // Batches in this rank's epoch (identical on every rank).
  int64_t NumBatches(int64_t batch_size, bool drop_last_batch = false) const;

  // This rank's rows from batch `start_step` to the end of the epoch
  // (start_step == NumBatches(...) gives an empty list). InvalidArgument
  // for batch_size < 1 or start_step outside [0, NumBatches].
  absl::StatusOr<std::vector<int64_t>> IndicesFromStep(
      int64_t start_step, int64_t batch_size,
      bool drop_last_batch = false) const;

  // The rows of batch `step` alone. OutOfRange past the last batch.
  absl::StatusOr<std::vector<int64_t>> BatchIndices(
      int64_t step, int64_t batch_size, bool drop_last_batch = false) const;

 private:
  explicit DistributedSampler(const SamplerOptions& options)
      : options_(options),
        num_samples_(SamplesPerRank(options.dataset_size, options.world_size,
                                    options.drop_last)) {}

  SamplerOptions options_;
  int64_t num_samples_ = 0;
  int64_t epoch_ = 0;
};

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_DISTRIBUTED_SAMPLER_H_
