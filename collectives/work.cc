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

void TpuDistWork::Finish(const absl::Status& status) {
  // The future completes first so that anyone released by wait() sees a
  // completed future.
  if (status.ok()) {
    future_->markCompleted(c10::IValue(outputs_));
    finish();
  } else {
    auto error = std::make_exception_ptr(
        std::runtime_error(std::string("tpu_dist: ") + status.ToString()));
    future_->setError(error);
    finish(error);
  }
}

bool TpuDistWork::wait(std::chrono::milliseconds timeout) {
  const auto limit = timeout == ::kNoTimeout
                         ? op_timeout_ + std::chrono::seconds(30)
                         : timeout;
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
  return future_;
}

}  // namespace tpudist::collectives
