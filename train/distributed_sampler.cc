#include "train/distributed_sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tpudist::train {
namespace {

// SplitMix64 (Steele, Lea, Flood 2014): a tiny, well-mixed 64-bit stream.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound) by rejection (no modulo bias). REQUIRES bound > 0.
  uint64_t Below(uint64_t bound) {
    const uint64_t limit = ~uint64_t{0} - (~uint64_t{0} % bound);
    uint64_t r;
    do {
      r = Next();
    } while (r >= limit);
    return r % bound;
  }

 private:
  uint64_t state_;
};

}  // namespace

std::vector<int64_t> EpochPermutation(int64_t n, bool shuffle, uint64_t seed,
                                      int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (!shuffle) return perm;
  // Mix seed and epoch through one SplitMix step each so nearby (seed,
  // epoch) pairs give unrelated streams.
  SplitMix64 mix(seed);
  const uint64_t s = mix.Next() ^ SplitMix64(static_cast<uint64_t>(epoch) +
                                             0x632BE59BD9B4E019ull)
                                      .Next();
  SplitMix64 rng(s);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

int64_t SamplesPerRank(int64_t n, int world_size, bool drop_last) {
  if (n <= 0 || world_size <= 0) return 0;
  return drop_last ? n / world_size : (n + world_size - 1) / world_size;
}

int64_t NumBatches(int64_t num_samples, int64_t batch_size,
                   bool drop_last_batch) {
  if (batch_size <= 0 || num_samples <= 0) return 0;
  return drop_last_batch ? num_samples / batch_size
                         : (num_samples + batch_size - 1) / batch_size;
}

absl::StatusOr<DistributedSampler> DistributedSampler::Create(
    const SamplerOptions& o) {
  if (o.dataset_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: dataset_size must be >= 1, got ",
                     o.dataset_size));
  }
  if (o.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: world_size must be >= 1, got ", o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampler: rank ", o.rank, " outside [0, ", o.world_size, ")"));
  }
  if (o.drop_last && o.dataset_size < o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampler: drop_last with ", o.dataset_size, " rows and world_size ",
        o.world_size, " leaves every rank empty"));
  }
  return DistributedSampler(o);
}

std::vector<int64_t> DistributedSampler::Indices() const {
  const int64_t n = options_.dataset_size;
  const std::vector<int64_t> perm =
      EpochPermutation(n, options_.shuffle, options_.seed, epoch_);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(num_samples_));
  for (int64_t k = 0; k < num_samples_; ++k) {
    const int64_t pos = options_.rank + k * options_.world_size;
    out.push_back(perm[static_cast<size_t>(pos % n)]);  // wrap = padding
  }
  return out;
}

int64_t DistributedSampler::NumBatches(int64_t batch_size,
                                       bool drop_last_batch) const {
  return train::NumBatches(num_samples_, batch_size, drop_last_batch);
}

absl::StatusOr<std::vector<int64_t>> DistributedSampler::IndicesFromStep(
    int64_t start_step, int64_t batch_size, bool drop_last_batch) const {
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: batch_size must be >= 1, got ", batch_size));
  }
  const int64_t batches = NumBatches(batch_size, drop_last_batch);
  if (start_step < 0 || start_step > batches) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: resume step ", start_step, " outside [0, ",
                     batches, "] for epoch ", epoch_, " (batch_size ",
                     batch_size, ")"));
  }
  std::vector<int64_t> all = Indices();
  const int64_t end = std::min<int64_t>(batches * batch_size, num_samples_);
  const int64_t begin = std::min<int64_t>(start_step * batch_size, end);
  return std::vector<int64_t>(all.begin() + begin, all.begin() + end);
}

absl::StatusOr<std::vector<int64_t>> DistributedSampler::BatchIndices(
    int64_t step, int64_t batch_size, bool drop_last_batch) const {
  auto rest = IndicesFromStep(step, batch_size, drop_last_batch);
  if (!rest.ok()) return rest.status();
  if (rest->empty()) {
    return absl::OutOfRangeError(absl::StrCat(
        "sampler: step ", step, " is past the last batch of epoch ", epoch_));
  }
  rest->resize(std::min<size_t>(rest->size(), static_cast<size_t>(batch_size)));
  return rest;
}

}  // namespace tpudist::train
