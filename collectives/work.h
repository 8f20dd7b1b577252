// The c10d::Work handle returned by every ProcessGroupTpuDist op.
//
// Contract: created pending by the issuing thread; completed exactly once by
// the group's worker thread via Finish(). wait(timeout) blocks until then (a
// kNoTimeout wait is still bounded, by the op's own timeout plus a grace
// period, because the worker always finishes an op by its deadline) and
// rethrows the op's error. getFuture() returns a future that completes with
// the op's output tensors as List[Tensor] (what DDP comm hooks expect), or
// with the op's error.
//
// Thread-safety: all methods are thread-safe.
#ifndef TPU_DIST_COLLECTIVES_WORK_H_
#define TPU_DIST_COLLECTIVES_WORK_H_

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <chrono>
#include <vector>

#include "absl/status/status.h"
#include "torch/csrc/distributed/c10d/Work.hpp"

namespace tpudist::collectives {

class TpuDistWork : public c10d::Work {
 public:
  // outputs: the tensors the future resolves to (op-specific shapes).
  TpuDistWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
              std::chrono::milliseconds op_timeout);

  // Completes the work; `status` non-OK makes it fail with that message.
  void Finish(const absl::Status& status);

  bool wait(std::chrono::milliseconds timeout = ::kNoTimeout) override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  std::vector<at::Tensor> outputs_;  // op-specific shapes
  std::chrono::milliseconds op_timeout_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_WORK_H_
