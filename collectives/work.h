// The c10d::Work handle returned by every ProcessGroupTpuDist op.
//
// Contract: created pending by the issuing thread; completed exactly once by
// the group's worker thread via Finish(). wait(timeout) blocks until then (a
// kNoTimeout wait is still bounded, by the op's own timeout plus a grace
// period, because the worker always finishes an op by its deadline) and
// rethrows the op's error. A wait() that may block as long as the op runs
// (no timeout, or one of at least the op's) first offers to run the op on
// the waiting thread (OpWorker::QueuedOp::RunHere: only when the op is
// next in an idle queue), so `work = op(async_op=True); work.wait()` pays no
// thread hand-off. isCompleted() never runs it. getFuture() returns a future that completes with
// the op's output tensors as List[Tensor] (what DDP comm hooks expect), or
// with the op's error.
// The future completes, and its callbacks run, on a callback thread
// (OpWorker::Post), never on the worker thread: a callback may issue ops and
// wait for them (PowerSGD). The future is made by the first getFuture(): an
// op nobody asked the future of (a plain wait(), dist.all_reduce) makes none,
// and one asked for after the op ended gets a future made complete. As with Gloo, the Work
// itself completes after the future and its callbacks: a callback that
// throws fails the Work (wait() rethrows it) and harms no thread. A callback
// chained with then() fails its own future instead (c10 semantics).
//
// Thread-safety: all methods are thread-safe.
#ifndef TPU_DIST_COLLECTIVES_WORK_H_
#define TPU_DIST_COLLECTIVES_WORK_H_

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <chrono>
#include <exception>
#include <mutex>
#include <vector>

#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "collectives/callback_threads.h"
#include "collectives/op_worker.h"
#include "torch/csrc/distributed/c10d/Work.hpp"

namespace tpudist::collectives {

class TpuDistWork : public c10d::Work {
 public:
  // outputs: the tensors the future resolves to (op-specific shapes).
  // Copied in (one inline slot: no allocation for a one-tensor op).
  TpuDistWork(int rank, c10d::OpType type, c10::ArrayRef<at::Tensor> outputs,
              std::chrono::milliseconds op_timeout);

  // Completes the work; `status` non-OK makes it fail with that message.
  // The future completes on `callbacks` if it has been handed out (null:
  // here, callbacks included).
  void Finish(const absl::Status& status, CallbackThreads* callbacks = nullptr)
      ABSL_LOCKS_EXCLUDED(future_mu_);
  // Finish() for a Work that nobody else has seen yet (an op run inline,
  // before the Work is returned): completes it without locking or waking
  // anyone, and marks it so wait() returns without locking.
  // REQUIRES: the caller holds the only reference and no future was made.
  void FinishUnshared(const absl::Status& status) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // The queued op that Finish()es this work, for wait() to run on the
  // waiter. Set once by the issuer before the work is handed out.
  void set_queued_op(OpWorker::QueuedOp op) { queued_op_ = std::move(op); }
  // The op's status, left by the thread that ran it for the Finish() that
  // follows (on that thread, or one the op queue orders after it).
  void set_op_status(absl::Status s) { op_status_ = std::move(s); }
  const absl::Status& op_status() const { return op_status_; }

  bool wait(std::chrono::milliseconds timeout = ::kNoTimeout) override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override ABSL_LOCKS_EXCLUDED(future_mu_);

 private:
  // Completes future_ with `error` or outputs_ (running its callbacks),
  // then the Work, with `error` or the exception a callback threw.
  // REQUIRES: future_ was made (getFuture() was called).
  void Complete(std::exception_ptr error);
  // Completes `future` with `error` or outputs_; rethrows what a callback threw.
  void CompleteFuture(c10::ivalue::Future& future, const std::exception_ptr& error);

  c10::SmallVector<at::Tensor, 1> outputs_;  // op-specific shapes
  std::chrono::milliseconds op_timeout_;
  OpWorker::QueuedOp queued_op_;  // empty: the op ran inline
  absl::Status op_status_;  // see set_op_status()
  // Set by FinishUnshared() before anyone else sees the Work; then fixed.
  bool finished_unshared_ = false;
  absl::Mutex future_mu_;
  // Made by the first getFuture(); null until then.
  c10::intrusive_ptr<c10::ivalue::Future> future_ ABSL_GUARDED_BY(future_mu_);
  bool ended_ ABSL_GUARDED_BY(future_mu_) = false;  // Finish() ran without a future
  std::exception_ptr ended_error_ ABSL_GUARDED_BY(future_mu_);  // its error, if any
};

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_WORK_H_
