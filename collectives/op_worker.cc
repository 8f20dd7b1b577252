#include "collectives/op_worker.h"

#include <pthread.h>

#include <utility>

namespace tpudist::collectives {

OpWorker::OpWorker(const std::string& name)
    : state_(std::make_shared<State>()),
      thread_([s = state_, n = name.substr(0, 15)] {
        pthread_setname_np(pthread_self(), n.c_str());
        Loop(s);
      }) {}

OpWorker::~OpWorker() {
  const bool on_worker = std::this_thread::get_id() == thread_.get_id();
  std::deque<std::pair<std::function<void()>, std::function<void()>>> dropped;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
    if (on_worker) dropped.swap(state_->queue);
  }
  state_->cv.notify_all();
  dropped.clear();  // outside the lock: closures may release more objects
  if (on_worker) {
    // Joining ourselves would throw EDEADLK; the thread owns `state_` too and
    // returns once the current op unwinds.
    thread_.detach();
  } else {
    thread_.join();
  }
}

void OpWorker::Enqueue(std::function<void()> op, std::function<void()> then) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->queue.emplace_back(std::move(op), std::move(then));
  }
  state_->cv.notify_one();
}

bool OpWorker::RunInlineIfIdle(const std::function<void()>& op,
                               const std::function<void()>& then) {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.busy || !s.queue.empty() || s.stop) return false;
    s.busy = true;
  }
  op();
  bool pending;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.busy = false;
    pending = !s.queue.empty();
  }
  // Wake the worker only if ops queued up meanwhile: an idle worker woken
  // for nothing costs a context switch per inline op.
  if (pending) s.cv.notify_all();
  if (then) then();
  return true;
}

void OpWorker::Loop(const std::shared_ptr<State>& state) {
  State& s = *state;
  while (true) {
    std::pair<std::function<void()>, std::function<void()>> task;
    {
      std::unique_lock<std::mutex> lock(s.mu);
      // Idle wait: every change that can make the predicate true (Enqueue,
      // stop, an inline op ending with ops queued) notifies the cv.
      s.cv.wait(lock, [&] { return !s.busy && (s.stop || !s.queue.empty()); });
      if (s.queue.empty()) return;
      task = std::move(s.queue.front());
      s.queue.pop_front();
      s.busy = true;
    }
    task.first();
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.busy = false;
    }
    // Idle before `then`: the caller it wakes may run its next op inline.
    if (task.second) task.second();
    // Completing or destroying the op may destroy the OpWorker (and its
    // group) on this thread; only `s`, owned by this thread too, is touched
    // afterwards.
    task = {};
  }
}

}  // namespace tpudist::collectives
