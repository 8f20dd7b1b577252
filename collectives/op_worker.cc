#include "collectives/op_worker.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace tpudist::collectives {

OpWorker::OpWorker(const std::string& name)
    : callbacks_(name.substr(0, 12) + "-cb"),
      state_(std::make_shared<State>()),
      thread_([s = state_, n = name.substr(0, 15)] {
        pthread_setname_np(pthread_self(), n.c_str());
        Loop(s);
      }),
      worker_id_(thread_.get_id()) {}

OpWorker::~OpWorker() {
  // After Stop() the thread has left (or is leaving); join it all the same.
  const bool on_worker = std::this_thread::get_id() == worker_id_;
  std::deque<Task> dropped;
  State& s = *state_;
  {
    absl::MutexLock lock(&s.mu);
    s.stop = true;
    if (on_worker) dropped.swap(s.queue);
  }
  s.cv.SignalAll();
  dropped.clear();  // outside the lock: closures may release more objects
  absl::MutexLock join(&join_mu_);
  if (!thread_.joinable()) return;  // Stop() joined it
  if (on_worker) {
    // Joining ourselves would throw EDEADLK; the thread owns `state_` too and
    // returns once the current op unwinds.
    thread_.detach();
  } else {
    thread_.join();
  }
}

OpWorker::QueuedOp OpWorker::Enqueue(std::function<void()> op, std::function<void()> then) {
  State& s = *state_;
  uint64_t id = 0;
  {
    absl::MutexLock lock(&s.mu);
    if (!s.exited) {
      id = ++s.last_id;
      s.queue.push_back(Task{id, std::move(op), std::move(then)});
    }
  }
  if (id != 0) {
    s.cv.SignalAll();  // the worker, not only a waiter in Stop()
    return QueuedOp(state_, id);
  }
  // Stopped: the thread is gone, so the op runs here (after any other op
  // that a caller runs here), bounded by its own deadline like any op.
  absl::MutexLock run(&s.after_exit_mu);
  op();
  if (then) then();
  absl::MutexLock lock(&s.mu);
  ++s.done;
  return QueuedOp();
}

bool OpWorker::Stop(absl::Time deadline) {
  State& s = *state_;
  bool on_worker;
  {
    absl::MutexLock lock(&s.mu);
    s.stop = true;
    s.cv.SignalAll();
    // On the worker itself (an op's closure shut its group down) or on a
    // callback thread (a future callback did) it cannot wait for itself:
    // the threads leave after the current op / callback and the queue.
    on_worker = OnWorkerThread();
    // Otherwise wait: the loop signals cv when it leaves.
    while (!on_worker && !s.exited) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return false;
      s.cv.WaitWithTimeout(&s.mu, std::min(left, absl::Seconds(1)));
    }
  }
  if (on_worker) {
    callbacks_.Stop(absl::InfinitePast());  // only asks
    return false;
  }
  {
    // The loop has returned (it sets `exited` on its way out): joining waits
    // only for the thread's own exit, so that a caller that checks for our
    // threads right after (destroy_process_group, then /proc/self/task)
    // never sees one that is still leaving.
    absl::MutexLock join(&join_mu_);
    if (thread_.joinable()) thread_.join();
  }
  // The worker has left: no more completions come from it (ops enqueued
  // from now on run on their callers, and so do their completions once the
  // callback threads have left too).
  return callbacks_.Stop(deadline);
}

int64_t OpWorker::ops_done() const {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  return s.done;
}

bool OpWorker::RunInlineIfIdle(const std::function<void()>& op,
                               const std::function<void()>& then) {
  if (!BeginInline()) return false;
  op();
  EndInline();
  if (then) then();
  return true;
}

bool OpWorker::BeginInline() {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  if (s.busy || !s.queue.empty() || s.stop) return false;
  s.busy = true;
  return true;
}

void OpWorker::EndInline() {
  State& s = *state_;
  bool pending;
  {
    absl::MutexLock lock(&s.mu);
    s.busy = false;
    ++s.done;
    pending = !s.queue.empty();
  }
  // Wake the worker only if ops queued up meanwhile: an idle worker woken
  // for nothing costs a context switch per inline op.
  if (pending) s.cv.SignalAll();
}

bool OpWorker::QueuedOp::RunHere() const {
  const std::shared_ptr<State> state = state_.lock();
  if (state == nullptr) return false;
  State& s = *state;
  Task task;
  {
    absl::MutexLock lock(&s.mu);
    // Not next (taken already, or an earlier op queued), or an op running.
    if (s.busy || s.queue.empty() || s.queue.front().id != id_) return false;
    task = std::move(s.queue.front());
    s.queue.pop_front();
    s.busy = true;
  }
  task.op();
  bool wake;
  {
    absl::MutexLock lock(&s.mu);
    s.busy = false;
    ++s.done;
    // The worker waits for !busy when ops are queued or it is stopping.
    wake = !s.queue.empty() || s.stop;
  }
  if (wake) s.cv.SignalAll();
  if (task.then) task.then();
  return true;  // `task`'s captures are released here, unlocked
}

void OpWorker::Loop(const std::shared_ptr<State>& state) {
  State& s = *state;
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&s.mu);
      // Idle wait until !busy && (stop || queue not empty): every change
      // that can make it true (Enqueue, stop, an inline op ending with ops
      // queued) signals the cv.
      while (s.busy || (!s.stop && s.queue.empty())) s.cv.Wait(&s.mu);
      if (s.queue.empty()) {
        // Stopped and drained; every closure has been released (below).
        s.exited = true;
        s.cv.SignalAll();  // Stop() waits on it
        return;
      }
      task = std::move(s.queue.front());
      s.queue.pop_front();
      s.busy = true;
    }
    task.op();
    {
      absl::MutexLock lock(&s.mu);
      s.busy = false;
      ++s.done;
    }
    // Idle before `then`: the caller it wakes may run its next op inline.
    if (task.then) task.then();
    // Completing or destroying the op may destroy the OpWorker (and its
    // group) on this thread; only `s`, owned by this thread too, is touched
    // afterwards.
    task = {};
  }
}

}  // namespace tpudist::collectives
