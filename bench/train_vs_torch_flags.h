// Flags of bench/train_vs_torch.cc (our side of bench/python/train_vs_torch.py,
// which passes the same values to its torch FSDP2 side), parsed and checked
// by a pure function so the checks have unit tests (bench_test).
//
//   --model_dir=DIR      Hugging Face Gemma 4 directory (data/tiny_gemma)
//   --world=N            ranks (forked processes), >= 1
//   --global_batch=G     sequences per step over all ranks; G % N == 0
//   --seq=S              tokens per sequence, >= 2 (the loss is shifted)
//   --warmup=K --steps=T untimed steps (step 0 among them, K >= 1), timed
//                        steps (T >= 1)
//   --lr --beta1 --beta2 --eps --weight_decay   AdamW (torch's defaults but
//                        lr 1e-3, weight_decay 0.01)
//   --seed=X             seed of the global batch of ids
//   --plan=layers|mlp    FullyShard every decoder layer (torchtitan) or every
//                        MLP (models/gemma ParallelizeGemma), then the root
//   --freeze_ple=0|1     freeze the PLE table (and leave it out of FSDP)
//   --backend=tpu_dist|gloo --timeout_s=SEC --json_out=FILE
//   --quick              world 2, global batch 4, seq 32, 1 + 2 steps
//
// Thread-safety: pure function.
#ifndef TPU_DIST_BENCH_TRAIN_VS_TORCH_FLAGS_H_
#define TPU_DIST_BENCH_TRAIN_VS_TORCH_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tpudist::bench {

struct TrainVsTorchFlags {
  std::string model_dir = "data/tiny_gemma";
  int world = 2;
  int64_t global_batch = 16, seq = 128;
  int warmup = 2, steps = 5;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  uint64_t seed = 1234;
  std::string plan = "layers";  // layers | mlp
  bool freeze_ple = false;
  std::string backend = "tpu_dist";  // tpu_dist | gloo
  int timeout_s = 300;
  std::string json_out;
  bool quick = false;
};

// Parses argv[1..argc) ("--name=value" and "--quick"; --quick applies its
// sizes first, later explicit flags win). InvalidArgument naming the flag on
// an unknown flag, a malformed number or a value outside its range above.
absl::StatusOr<TrainVsTorchFlags> ParseTrainVsTorchFlags(int argc, const char* const* argv);

}  // namespace tpudist::bench

#endif  // TPU_DIST_BENCH_TRAIN_VS_TORCH_FLAGS_H_
