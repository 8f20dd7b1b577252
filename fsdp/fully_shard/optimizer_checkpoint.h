// Sharded AdamW state next to a sharded model checkpoint, for exact resume.
//
// Under FullyShard the optimizer steps on this rank's parameter shards, so
// its state (exp_avg, exp_avg_sq [, max_exp_avg_sq] and step) is sharded the
// same way. Each rank writes its own file into `dir`:
//
//   optim-<r>-of-<W>.safetensors   "<FQN>.exp_avg"        [shard shape] f32
//                                  "<FQN>.exp_avg_sq"     [shard shape]
//                                  "<FQN>.max_exp_avg_sq" (amsgrad only)
//                                  "<FQN>.step"           [1] int64
//                                  metadata {"world_size": W, "rank": r}
//
// FQNs are `model`'s named_parameters(); parameters without state (frozen,
// never stepped) are absent. Loading requires the same world size (and so
// the same shard shapes): optimizer-state resharding is not supported, a
// different W is FailedPrecondition naming both sizes. Keys missing from the
// file leave that parameter without state; a shape mismatch is
// InvalidArgument naming the key.
//
// No communication: each rank reads and writes only its own file (the
// trainer puts a barrier around the checkpoint). REQUIRES: parameters
// sharded (between steps), `optimizer` built over model->parameters().
#ifndef TPU_DIST_FSDP_FULLY_SHARD_OPTIMIZER_CHECKPOINT_H_
#define TPU_DIST_FSDP_FULLY_SHARD_OPTIMIZER_CHECKPOINT_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include "absl/status/status.h"

namespace tpudist::fsdp {

// "optim-<rank>-of-<world>.safetensors". Pure.
std::string OptimizerShardFileName(int rank, int world_size);

// SaveShardedAdamWState in two halves, for asynchronous saves: the
// optimizer's state as (key, tensor) views of the live state (the step
// counts as fresh [1] int64 tensors), and the write of such a list (a copy
// of it) as this rank's file. No communication.
std::vector<std::pair<std::string, at::Tensor>> CollectAdamWState(const std::shared_ptr<torch::nn::Module>& model,
                                                                  torch::optim::AdamW& optimizer);
absl::Status WriteAdamWState(const std::vector<std::pair<std::string, at::Tensor>>& tensors, int rank,
                             int world_size, const std::string& dir);

absl::Status SaveShardedAdamWState(const std::shared_ptr<torch::nn::Module>& model,
                                   torch::optim::AdamW& optimizer, int rank, int world_size,
                                   const std::string& dir);

absl::Status LoadShardedAdamWState(const std::shared_ptr<torch::nn::Module>& model,
                                   torch::optim::AdamW& optimizer, int rank, int world_size,
                                   const std::string& dir);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_FULLY_SHARD_OPTIMIZER_CHECKPOINT_H_
