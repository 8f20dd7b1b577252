// FusedAdamW: torch::optim::AdamW whose step() updates all parameters of a
// dtype with ONE call of ATen's fused AdamW kernel (at::_fused_adamw_, the
// kernel behind torch.optim.AdamW(fused=True)) instead of AdamW's per-tensor
// loop of about eight ops and two temporaries per parameter. On small models
// (the tiny Gemma has ~100 parameter tensors) that loop is per-op overhead,
// not arithmetic.
//
// Same options, same state (AdamWParamState: step, exp_avg, exp_avg_sq,
// max_exp_avg_sq) and same save/load as torch::optim::AdamW, so optimizer
// checkpoints and code taking a torch::optim::AdamW& work unchanged. Results
// agree with torch::optim::AdamW to float rounding (the fused kernel
// evaluates the same formula in another order), not bit for bit.
//
// REQUIRES: dense, contiguous parameters (FullyShard's shards and plain
// module parameters are); a non-contiguous gradient is made contiguous.
// The step counters the kernel reads are kept as one fp32 scalar tensor per
// parameter beside the state, refreshed from AdamWParamState::step whenever
// that was changed from outside (load, a new state).
//
// Thread-safety: like torch::optim::AdamW, one thread at a time.
#ifndef TPU_DIST_NN_FUSED_ADAMW_H_
#define TPU_DIST_NN_FUSED_ADAMW_H_

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/optim/adamw.h>

namespace tpudist::nn {

class FusedAdamW : public torch::optim::AdamW {
 public:
  explicit FusedAdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                      torch::optim::AdamWOptions defaults = {})
      : torch::optim::AdamW(param_groups, std::move(defaults)) {}
  explicit FusedAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults = {})
      : torch::optim::AdamW(std::move(params), std::move(defaults)) {}

  // One AdamW update of every parameter with a gradient (the closure, if
  // any, runs first with grad mode on; its loss is returned).
  at::Tensor step(LossClosure closure = nullptr) override;

 private:
  struct StepCounter {
    at::Tensor value;  // [] fp32, what the fused kernel reads
    int64_t mirrors = -1;  // the AdamWParamState::step it holds
  };
  std::unordered_map<const void*, StepCounter> steps_;  // by TensorImpl*
};

}  // namespace tpudist::nn

#endif  // TPU_DIST_NN_FUSED_ADAMW_H_
