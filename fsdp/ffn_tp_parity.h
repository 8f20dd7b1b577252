// CheckFfnTpParity: the check ffn_tp_check runs on each rank (see
// examples/ffn_tp_check_main.cc), apart from its flags and its job.
//
// Seed 42, FeedForward(hidden) = x + w2(SiLU(w1(x))) (no bias) computed on
// one device (the reference, forward + backward), then the same model with
// the plan {w1: ColwiseParallel, w2: RowwiseParallel} over `mesh` (1-D, every
// rank); output, input grad and the w1/w2 grad shards must match the
// reference (rtol 1e-3, atol 1e-2). Then an all_reduce of 4 x (rank + 1) on
// the mesh's group must give W(W+1)/2, and a MIN all_reduce makes the job's
// verdict. Every rank writes its line to `store` ("line/<rank>"); rank 0
// prints them in rank order and a summary ("All W <backend> ranks verified
// DTensor TP parity ..." or "FAILED: ...").
//
// options.wrong_style (the negative test) leaves w2's output Partial, i.e.
// skips the all-reduce TP needs: parity must then fail.
// Errors: the plan's, or Internal naming this rank's parity and all_reduce
// results when the job's verdict is "failed". Waits: options.timeout each.
#ifndef TPU_DIST_FSDP_FFN_TP_PARITY_H_
#define TPU_DIST_FSDP_FFN_TP_PARITY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "fsdp/device_mesh.h"
#include "torch/csrc/distributed/c10d/Store.hpp"
#include "tpu_runtime/rank_info.h"

namespace tpudist::fsdp {

struct FfnTpParityOptions {
  int64_t batch = 4;        // rows of the input
  int64_t hidden = 64;      // w1: hidden -> 4*hidden
  bool wrong_style = false;
  std::string backend;      // for the summary line
  absl::Duration timeout = absl::Seconds(120);
};

absl::Status CheckFfnTpParity(const tpu_runtime::RankInfo& info, const fsdp::DeviceMesh& mesh,
                              c10d::Store& store, const FfnTpParityOptions& options);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_FFN_TP_PARITY_H_
