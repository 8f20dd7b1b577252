#include "collectives/work.h"

#include <stdexcept>
#include <string>

namespace tpudist::collectives {

TpuDistWork::TpuDistWork(int rank, c10d::OpType type,
                         std::vector<at::Tensor> outputs,
                         std::chrono::milliseconds op_timeout)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      op_timeout_(op_timeout),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

void TpuDistWork::Finish(const absl::Status& status, CallbackThreads* callbacks) {
  std::exception_ptr error;
  if (!status.ok()) {
    error = std::make_exception_ptr(
        std::runtime_error(std::string("tpu_dist: ") + status.ToString()));
  }
  {
    absl::MutexLock lock(&future_mu_);
    if (!future_handed_out_) {
      // No holder, so no callbacks: complete it before getFuture() can hand
      // it out pending (callbacks added later run on their adder's thread).
      Complete(error);
      return;
    }
  }
  if (callbacks != nullptr) {
    callbacks->Post([self = c10::intrusive_ptr<TpuDistWork>::unsafe_reclaim_from_nonowning(this),
                     error] { self->Complete(error); });
    return;
  }
  Complete(error);  // handed out, no callback threads: here
}

void TpuDistWork::Complete(std::exception_ptr error) {
  // The future completes first so that anyone released by wait() sees a
  // completed future.
  std::exception_ptr callback_error;
  try {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  } catch (...) {  // a callback threw (c10 skips the callbacks after it)
    callback_error = std::current_exception();
  }
  finish(error ? error : callback_error);
}

bool TpuDistWork::wait(std::chrono::milliseconds timeout) {
  const auto limit = timeout == ::kNoTimeout
                         ? op_timeout_ + std::chrono::seconds(30)
                         : timeout;
  // Blocking for as long as the op may run anyway: run it here if it is
  // next in an idle queue (a no-op once it has been taken or has finished).
  if (limit >= op_timeout_) queued_op_.RunHere();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, limit, [&] { return completed_; })) {
    throw std::runtime_error("tpu_dist: Work::wait timed out after " +
                             std::to_string(limit.count()) + " ms");
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

std::vector<at::Tensor> TpuDistWork::result() { return outputs_; }

c10::intrusive_ptr<c10::ivalue::Future> TpuDistWork::getFuture() {
  absl::MutexLock lock(&future_mu_);
  future_handed_out_ = true;
  return future_;
}

}  // namespace tpudist::collectives
