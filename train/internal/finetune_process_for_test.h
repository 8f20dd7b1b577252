// Test-only: runs gemma_finetune under tpurun as a child process, every
// child under `timeout -s KILL`, so that a hang fails the test instead of
// blocking it. Not part of the library.
#ifndef TPU_DIST_TRAIN_INTERNAL_FINETUNE_PROCESS_FOR_TEST_H_
#define TPU_DIST_TRAIN_INTERNAL_FINETUNE_PROCESS_FOR_TEST_H_

#include <stdio.h>
#include <sys/wait.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace tpudist::train::internal {

struct RunOutput {
  int exit_code = -1;
  std::string output;  // stdout + stderr of tpurun and every rank
};

// Runs `cmd` under sh, its stdout (and whatever it redirects there) captured.
inline RunOutput RunCapturing(const std::string& cmd) {
  RunOutput r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// `tpurun --nproc N <tpurun_args> -- <gemma_finetune> --timeout 120s <args>`
// with OMP_NUM_THREADS=1, at most limit_s seconds.
inline RunOutput RunGemmaFinetune(const std::string& tpurun, const std::string& binary, int nproc,
                                  const std::string& tpurun_args, const std::string& args, int limit_s) {
  return RunCapturing(absl::StrCat("OMP_NUM_THREADS=1 timeout -s KILL ", limit_s, " ", tpurun, " --nproc ",
                                   nproc, " ", tpurun_args, " -- ", binary, " --timeout 120s ", args, " 2>&1"));
}

}  // namespace tpudist::train::internal

#endif  // TPU_DIST_TRAIN_INTERNAL_FINETUNE_PROCESS_FOR_TEST_H_
