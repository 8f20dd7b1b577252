#include "collectives/op_worker.h"

#include <chrono>

namespace tpudist::collectives {

OpWorker::OpWorker() : thread_([this] { Loop(); }) {}

OpWorker::~OpWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void OpWorker::Enqueue(std::function<void()> op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(op));
  }
  cv_.notify_one();
}

bool OpWorker::RunInlineIfIdle(const std::function<void()>& op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_ || !queue_.empty() || stop_) return false;
    busy_ = true;
  }
  op();
  bool pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    pending = !queue_.empty();
  }
  // Wake the worker only if ops queued up meanwhile: an idle worker woken
  // for nothing costs a context switch per inline op.
  if (pending) cv_.notify_all();
  return true;
}

void OpWorker::Loop() {
  while (true) {
    std::function<void()> op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Idle wait, re-checked every 100 ms so no wait is unbounded.
      while (!cv_.wait_for(lock, std::chrono::milliseconds(100),
                           [&] { return !busy_ && (stop_ || !queue_.empty()); })) {
      }
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    op();
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
  }
}

}  // namespace tpudist::collectives
