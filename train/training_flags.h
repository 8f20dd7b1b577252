// Bounds on the fine-tune's numeric hyper-parameters (gemma_finetune's
// --num-epochs, --batch-size-per-device, --max-seq-len, --lr,
// --weight-decay), checked before anything is loaded so that a typo is a
// one-line usage error rather than a torch check deep in AdamW or an
// allocation of absurd size.
//
//   num_epochs             [1, kMaxEpochs]
//   batch_size_per_device  [1, kMaxBatchSizePerDevice]
//   max_seq_len            [2, kMaxSeqLen]  (one next-token pair at least)
//   batch x max_seq_len    <= kMaxTokensPerStep per device
//   lr                     finite, >= 0 (0 is allowed: tests compare runs
//                          whose weights must not move), and 0 or a normal
//                          float32 (the optimizer's compute type: 1e-300
//                          would be 0 there, 1e39 inf)
//   weight_decay           the same
//
// Pure; safe from any thread.
#ifndef TPU_DIST_TRAIN_TRAINING_FLAGS_H_
#define TPU_DIST_TRAIN_TRAINING_FLAGS_H_

#include <cstdint>

#include "absl/status/status.h"

namespace tpudist::train {

inline constexpr int64_t kMaxEpochs = int64_t{1} << 20;
inline constexpr int64_t kMaxBatchSizePerDevice = int64_t{1} << 16;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 20;
inline constexpr int64_t kMaxTokensPerStep = int64_t{1} << 24;
inline constexpr int64_t kMaxTensorParallel = int64_t{1} << 16;

struct TrainingFlags {
  int64_t num_epochs = 3;
  int64_t batch_size_per_device = 4;
  int64_t max_seq_len = 512;
  double lr = 2e-5;
  double weight_decay = 0.01;
  int64_t tp = 1;  // tensor-parallel ranks per dp replica (--tp)
};

// InvalidArgument naming the flag, its value and the accepted range, e.g.
// "--lr nan: must be a finite number >= 0".
absl::Status ValidateTrainingFlags(const TrainingFlags& flags);

// InvalidArgument naming --tp when it does not divide `world_size`, e.g.
// "--tp 3: must divide the world size 4 (the mesh is world/tp x tp)".
absl::Status ValidateTensorParallel(int64_t tp, int64_t world_size);

// HSDP (--hsdp): the mesh is (dp_replicate, world / dp_replicate) with dims
// ("dp_replicate", "dp_shard"). InvalidArgument naming both numbers when
// dp_replicate < 1 or does not divide `world_size`, e.g. "--hsdp: the world
// size 6 is not divisible by 4 replicas (dp_replicate: --dp-replicate, or the
// job's slice count)"; and when tp > 1 (HSDP x TP, a 3-D mesh, is not
// supported).
absl::Status ValidateHsdp(int64_t dp_replicate, int64_t world_size, int64_t tp);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_TRAINING_FLAGS_H_
