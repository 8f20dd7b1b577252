#include "train/training_flags.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace tpudist::train {
namespace {

constexpr double kMinNormalFloat = std::numeric_limits<float>::min();
constexpr double kMaxFloat = std::numeric_limits<float>::max();

absl::Status CheckRange(const char* flag, int64_t value, int64_t min, int64_t max) {
  if (value >= min && value <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(flag, " ", value, ": must be in [", min, ", ", max, "]"));
}

absl::Status CheckNonNegative(const char* flag, double value) {
  if (!std::isfinite(value) || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", value, ": must be a finite number >= 0"));
  }
  // The optimizer computes in fp32: a value that is 0, subnormal or inf
  // there is not the value asked for.
  if (value != 0 && (value < kMinNormalFloat || value > kMaxFloat)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", value, ": is ",
                                                   value < kMinNormalFloat ? "0 or subnormal" : "inf",
                                                   " in float32, the optimizer's compute type: use 0 or a value in [",
                                                   kMinNormalFloat, ", ", kMaxFloat, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTrainingFlags(const TrainingFlags& f) {
  for (absl::Status s : {CheckRange("--num-epochs", f.num_epochs, 1, kMaxEpochs),
                         CheckRange("--batch-size-per-device", f.batch_size_per_device, 1, kMaxBatchSizePerDevice),
                         CheckRange("--max-seq-len", f.max_seq_len, 2, kMaxSeqLen),
                         CheckNonNegative("--lr", f.lr), CheckNonNegative("--weight-decay", f.weight_decay),
                         CheckRange("--tp", f.tp, 1, kMaxTensorParallel)}) {
    if (!s.ok()) return s;
  }
  if (f.batch_size_per_device * f.max_seq_len > kMaxTokensPerStep) {
    return absl::InvalidArgumentError(absl::StrCat("--batch-size-per-device ", f.batch_size_per_device,
                                                   " x --max-seq-len ", f.max_seq_len, " = ",
                                                   f.batch_size_per_device * f.max_seq_len,
                                                   " tokens per step and device: must be <= ", kMaxTokensPerStep));
  }
  return absl::OkStatus();
}

absl::Status ValidateTensorParallel(int64_t tp, int64_t world_size) {
  if (tp >= 1 && world_size >= 1 && world_size % tp == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--tp ", tp, ": must divide the world size ", world_size,
                                                 " (the mesh is world/tp x tp)"));
}

absl::Status ValidateHsdp(int64_t dp_replicate, int64_t world_size, int64_t tp) {
  if (tp != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hsdp with --tp ", tp, ": HSDP x tensor parallel (a 3-D mesh) is not supported"));
  }
  if (dp_replicate >= 1 && world_size >= 1 && world_size % dp_replicate == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--hsdp: the world size ", world_size, " is not divisible by ", dp_replicate,
      " replicas (dp_replicate: --dp-replicate, or the job's slice count; the mesh is dp_replicate x "
      "world/dp_replicate)"));
}

}  // namespace tpudist::train
