// The command line of gemma_finetune (gemma_finetune_main.cc): its flags,
// the config they make, the job-shape check and rank 0's closing lines.
// Flags live here and in the *_main.cc files only (STYLE.md rule 7).
#ifndef TPU_DIST_TRAIN_GEMMA_FINETUNE_CLI_H_
#define TPU_DIST_TRAIN_GEMMA_FINETUNE_CLI_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "train/finetune_trainer.h"
#include "tpu_runtime/rank_info.h"

namespace tpudist::train {

// The config the flags give (--storage-path defaults to $STORAGE_PATH,
// --max-failures -1 to $TORCHELASTIC_MAX_RESTARTS, else 0). InvalidArgument,
// naming the flag, for a value out of range (train/training_flags.h,
// tpu_runtime/duration_check.h): a usage error.
absl::StatusOr<FineTuneConfig> FineTuneConfigFromFlags();

// FailedPrecondition unless the job has the ranks --topology /
// --accelerator-type / --num-workers ask for (each: unset = as discovered;
// --topology is one slice's, so a multi-slice job has num_slices times its devices).
absl::Status CheckJobShape(const tpu_runtime::RankInfo& info);

// Rank 0's closing lines on stdout: "Training completed! Final metrics:
// {...}" and "Saved checkpoint: <dir>", or for a run that was already done
// "Training already completed: ..." with its logged metrics.
void PrintFineTuneResult(const FineTuneResult& result);

}  // namespace tpudist::train

#endif  // TPU_DIST_TRAIN_GEMMA_FINETUNE_CLI_H_
