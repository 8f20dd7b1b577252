#include "collectives/work.h"

#include <stdexcept>
#include <string>

namespace tpudist::collectives {
namespace {

// List[Tensor], the type of every TpuDistWork future; made once (a type is
// a shared_ptr: making it per op costs an allocation).
const c10::TypePtr& TensorListType() {
  static const c10::TypePtr* const type =
      new c10::TypePtr(c10::ListType::create(c10::TensorType::get()));
  return *type;
}

// The exception a Work fails with for `status`; null when OK.
std::exception_ptr ErrorFor(const absl::Status& status) {
  if (status.ok()) return nullptr;
  return std::make_exception_ptr(
      std::runtime_error(std::string("tpu_dist: ") + status.ToString()));
}

}  // namespace

TpuDistWork::TpuDistWork(int rank, c10d::OpType type,
                         c10::ArrayRef<at::Tensor> outputs,
                         std::chrono::milliseconds op_timeout)
    : c10d::Work(rank, type), outputs_(outputs.begin(), outputs.end()),
      op_timeout_(op_timeout) {}

void TpuDistWork::FinishUnshared(const absl::Status& status) {
  exception_ = ErrorFor(status);
  ended_error_ = exception_;
  // c10d::Work::finish() without its lock and wake: nobody can be waiting.
  completed_ = true;
  ended_ = true;
  finished_unshared_ = true;
}

void TpuDistWork::Finish(const absl::Status& status, CallbackThreads* callbacks) {
  const std::exception_ptr error = ErrorFor(status);
  bool no_future;
  {
    absl::MutexLock lock(&future_mu_);
    no_future = future_ == nullptr;
    if (no_future) {
      // Nobody holds a future, so nobody added a callback: a later
      // getFuture() makes one complete (its callbacks run on their adder's
      // thread). No future, no output list: the common op pays for neither.
      ended_ = true;
      ended_error_ = error;
    }
  }
  if (no_future) {
    finish(error);
    return;
  }
  if (callbacks != nullptr) {
    callbacks->Post([self = c10::intrusive_ptr<TpuDistWork>::unsafe_reclaim_from_nonowning(this),
                     error] { self->Complete(error); });
    return;
  }
  Complete(error);  // handed out, no callback threads: here
}

void TpuDistWork::CompleteFuture(c10::ivalue::Future& future, const std::exception_ptr& error) {
  if (error) {
    future.setError(error);
  } else {
    future.markCompleted(c10::IValue(std::vector<at::Tensor>(outputs_.begin(), outputs_.end())));
  }
}

void TpuDistWork::Complete(std::exception_ptr error) {
  // The future completes first so that anyone released by wait() sees a
  // completed future.
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    absl::MutexLock lock(&future_mu_);
    future = future_;
  }
  std::exception_ptr callback_error;
  try {
    CompleteFuture(*future, error);
  } catch (...) {  // a callback threw (c10 skips the callbacks after it)
    callback_error = std::current_exception();
  }
  finish(error ? error : callback_error);
}

bool TpuDistWork::wait(std::chrono::milliseconds timeout) {
  if (finished_unshared_) {  // ran inline: complete before anyone saw it
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }
  const auto limit = timeout == ::kNoTimeout
                         ? op_timeout_ + std::chrono::seconds(30)
                         : timeout;
  // Blocking for as long as the op may run anyway: run it here if it is
  // next in an idle queue (a no-op once it has been taken or has finished).
  if (limit >= op_timeout_) queued_op_.RunHere();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!completed_ && !cv_.wait_for(lock, limit, [&] { return completed_; })) {
    throw std::runtime_error("tpu_dist: Work::wait timed out after " +
                             std::to_string(limit.count()) + " ms");
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

std::vector<at::Tensor> TpuDistWork::result() {
  return std::vector<at::Tensor>(outputs_.begin(), outputs_.end());
}

c10::intrusive_ptr<c10::ivalue::Future> TpuDistWork::getFuture() {
  absl::MutexLock lock(&future_mu_);
  if (future_ == nullptr) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(TensorListType());
    if (ended_) {
      // The op ended before anyone asked: complete it now. Nobody else holds
      // it, so no callback runs here (under the lock).
      try {
        CompleteFuture(*future_, ended_error_);
      } catch (...) {
      }
    }
  }
  return future_;
}

}  // namespace tpudist::collectives
