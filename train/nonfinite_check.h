// Stopping a fine-tune whose numbers left the finite range (NaN, +-inf)
// before they reach the weights or a checkpoint.
//
// Each step, after backward and before the optimizer step, every rank
// measures its loss and the L2 norm of its gradients (MeasureStep: the
// per-tensor norms of torch's clip_grad_norm_, in the gradients' dtype, then
// their total in double) and writes them into its own slots of a
// [world x kStepSlots] double tensor that is zero elsewhere (PackSlots). One
// all-reduce SUM of that tensor gives every rank every rank's values exactly
// (x + 0 == x, also for NaN and inf), so all ranks take the same decision
// from the same numbers (CheckStepNumerics) and none waits in a collective
// the others skipped. The first non-finite quantity is named: the loss
// (computed first) before the gradient norm, and for each the lowest rank;
// for a gradient, also the first parameter whose gradient norm is
// non-finite on that rank.
//
// Before an epoch's checkpoint is written, every rank looks for a
// non-finite element in the tensors it would save (its weight shards, the
// frozen per-layer embedding, the AdamW moments: FirstNonFinite) and the
// same kind of all-reduce agrees on it (CheckSavedTensors): finite gradients
// do not guarantee finite weights (lr x weight decay > 2 grows them each
// step until they overflow).
//
// Pure but for the tensor reductions; safe from any thread on distinct
// tensors.
#ifndef TPU_DIST_TRAIN_NONFINITE_CHECK_H_
#define TPU_DIST_TRAIN_NONFINITE_CHECK_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace tpudist::train {

// What one rank measured in one step, before the optimizer step.
struct StepNumerics {
  double loss = 0.0;
  // L2 norm over this rank's gradient tensors (its shards), in double from
  // per-tensor norms computed in each gradient's dtype (fp32: a norm above
  // ~3.4e38 is inf, as in torch's clip_grad_norm_).
  double grad_norm = 0.0;
  int64_t first_bad_grad = -1;  // index into params of the first non-finite gradient norm
};

// Measures this rank's step. Parameters without a gradient are skipped.
StepNumerics MeasureStep(double loss, absl::Span<const at::Tensor> params);

// Index of the first tensor with a NaN or inf element; -1 when all are
// finite (undefined tensors are skipped).
int64_t FirstNonFinite(absl::Span<const at::Tensor> tensors);

// Slots per rank of the step tensor: loss, gradient norm, first bad
// gradient's index + 1 (0: none).
inline constexpr int64_t kStepSlots = 3;

// [world * mine.size()] double, `mine` at rank * mine.size(), zero
// elsewhere: what each rank contributes to the all-reduce SUM.
// REQUIRES: 0 <= rank < world.
at::Tensor PackSlots(absl::Span<const double> mine, int64_t rank, int64_t world);

// The step's slots of `numerics`.
at::Tensor PackStepNumerics(const StepNumerics& numerics, int64_t rank, int64_t world);

// Where training is, 1-based, for messages: "epoch 1/2, step 3/8".
struct TrainingPosition {
  int64_t epoch = 1;
  int64_t num_epochs = 1;
  int64_t step = 1;  // 0: the end of the epoch
  int64_t num_steps = 1;
};

// The decision every rank takes from the same summed tensor.
struct NonFiniteVerdict {
  bool ok() const { return error.ok(); }
  absl::Status error;  // FailedPrecondition naming position, rank, quantity and value
  int64_t rank = -1;   // the rank it names: it reports the job error first
};

// From the all-reduced [world * kStepSlots] tensor. `grad_names` names
// params' entries (index order of MeasureStep). E.g.
//   "non-finite loss at epoch 1/2, step 3/8 on rank 1: loss=nan (also
//   non-finite on ranks 0, 2); stopped before the optimizer step: ..."
NonFiniteVerdict CheckStepNumerics(const at::Tensor& summed, int64_t world, const TrainingPosition& where,
                                   absl::Span<const std::string> grad_names);

// From the all-reduced [world] tensor whose slot r is rank r's
// FirstNonFinite(saved) + 1. `names` names the saved tensors.
NonFiniteVerdict CheckSavedTensors(const at::Tensor& summed, int64_t world, const TrainingPosition& where,
                                   absl::Span<const std::string> names);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_NONFINITE_CHECK_H_
