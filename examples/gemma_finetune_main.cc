// gemma_finetune: the seed's Ray Train fine-tune (ray_train_llm_finetune.py)
// as a C++ binary, one process per device under tpurun (or any launcher
// whose environment tpu_runtime reads).
//
//   tpurun --accelerator-type TPU-V6E --topology 2x2 --max-restarts 1 --
//       build/examples/gemma_finetune --storage-path /tmp/ft --max-failures 1
//
// Defaults: the bundled tiny Gemma 4 (data/tiny_gemma) and instruction set
// (data/instructions/train.jsonl), and the seed's hyper-parameters. Rank 0
// prints one line per epoch, then "Training completed! Final metrics: {...}"
// and "Saved checkpoint: <dir>". See docs/finetune.md.
//
// Failures: restarts are the launcher's (tpurun --max-restarts N); pass the
// same N as --max-failures (default: $TORCHELASTIC_MAX_RESTARTS when set).
// Every attempt, first or restarted, resumes from the newest checkpoint of
// its run directory that verifies and was written by the same job; another
// job's checkpoints are an error (or --resume-mismatched); a finished run
// prints "Training already completed" and exits 0. Only one job may use a
// run directory at a time. --die-rank/--die-epoch/--die-step (tests) kill
// one rank in attempt 0. See docs/finetune.md, Guarantees. The flags are in
// gemma_finetune_cli.cc; the rank's skeleton (discovery, the job, error
// line, exit 1 or 75) is distributed/rank_main.h's and job.h's.
#include <stdio.h>

#include <string>

#include "absl/flags/parse.h"
#include "distributed/rank_main.h"
#include "train/finetune_trainer.h"
#include "train/gemma_finetune_cli.h"
#include "nn/malloc_tuning.h"
#include "tpu_runtime/launcher/flag_names.h"
#include "tpu_runtime/rank_info.h"

int main(int argc, char** argv) {
  namespace dist = ::tpudist::distributed;
  namespace train = ::tpudist::train;
  tpudist::tpu_runtime::launcher::NormalizedArgv args(argc, argv);
  absl::ParseCommandLine(args.argc(), args.argv());
  const absl::StatusOr<train::FineTuneConfig> config = train::FineTuneConfigFromFlags();
  if (int code = dist::UsageExitCode("gemma_finetune", {config.status()})) return code;
  return dist::RunRankMain(
      "gemma_finetune",
      [&](const tpudist::tpu_runtime::RankInfo& info) -> absl::Status {
        const std::string malloc_note = tpudist::nn::TuneMallocForTraining();
        if (info.rank == 0) fprintf(stderr, "gemma_finetune: %s\n", malloc_note.c_str());
        if (absl::Status s = train::CheckJobShape(info); !s.ok()) return s;
        absl::StatusOr<train::FineTuneResult> result = train::RunFineTune(info, *config);
        if (!result.ok()) return result.status();
        if (info.rank == 0) train::PrintFineTuneResult(*result);
        return absl::OkStatus();
      },
      // "gemma_finetune: error: ..." (the status names the rank), as before.
      {.failure_line = dist::FailureLine::kError});
}
