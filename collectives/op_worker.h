// A single worker thread that runs a process group's ops in issue order, so
// that c10d calls return immediately (async Work) and communication overlaps
// the caller's compute.
//
// Contract: Enqueue() never blocks on the op (until Stop(), below); ops run
// one at a time, FIFO (inline ops included).
// Stop() ends the thread early, while its owner lives on (c10d's shutdown(),
// interpreter exit): the ops queued so far still run (each is bounded by its
// own deadline), the thread leaves once their closures are released, and ops
// enqueued afterwards run on the calling thread. Stop() waits until the thread
// has left or a deadline passes. Python needs this: a thread that releases the
// last reference to a tensor takes the GIL, and one that tries during
// interpreter finalization is ended with pthread_exit, whose unwinding through
// a destructor calls std::terminate (SIGABRT at exit).
// The destructor stops accepting ops, drains the queue (each op is bounded by
// its own deadline) and joins. If it runs on the worker thread itself (an op
// or its captures dropped the last reference to the owning group), it cannot
// join: it discards the ops still queued (their closures are destroyed, so
// their Work handles are released unfinished; a waiter times out) and
// detaches; the thread then exits after the current op. The queue state is
// shared with the thread, so nothing it touches afterwards is freed.
//
// The idle worker sleeps on a condition variable until an op, a stop, or the
// end of an inline op with ops queued behind it: it does not poll.
//
// An op may come with a `then` step (completing its Work) that runs after
// the worker is marked idle again: a caller woken by that completion finds
// the worker idle and can run its next op inline. Without the split, the
// woken caller raced the worker's own bookkeeping, usually lost, queued its
// op, and every later waited-on op followed it onto the worker thread.
//
// Each worker owns callback threads (callback_threads.h) on which its ops'
// Work futures complete when someone holds them: a future callback that
// issues an op and waits for it must not run on the thread that runs ops.
// Stop() and the destructor stop them too, after the worker thread.
//
// A caller about to block on a queued op can run it itself
// (QueuedOp::RunHere) when no op is running and it is next in the queue:
// no thread hand-off is paid. TpuDistWork::wait() does so.
//
// Thread-safety: Enqueue(), RunInlineIfIdle(), QueuedOp::RunHere() and
// Post() are thread-safe.
// Locking is compiler-checked (absl::Mutex with ABSL_GUARDED_BY; the ctest
// thread_safety_check, docs/collectives.md "Locking").
#ifndef TPU_DIST_COLLECTIVES_OP_WORKER_H_
#define TPU_DIST_COLLECTIVES_OP_WORKER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "collectives/callback_threads.h"

namespace tpudist::collectives {

class OpWorker {
 private:
  struct State;

 public:
  // `name` names the thread (pthread_setname_np: ps, top -H, gdb, perf);
  // truncated to 15 characters.
  explicit OpWorker(const std::string& name = "tpud-op");
  OpWorker(const OpWorker&) = delete;
  OpWorker& operator=(const OpWorker&) = delete;
  ~OpWorker();

  // An op that Enqueue() queued, for the caller that is about to block on
  // it. Copyable; empty by default (RunHere() then does nothing). Holds the
  // queue weakly: it may outlive the worker.
  class QueuedOp {
   public:
    QueuedOp() = default;
    // For a caller that would otherwise block until the op has run: if no
    // op is running and this op is at the front of the queue (every op
    // queued before it has run), runs it on the calling thread, then its
    // `then`, as the worker would, and returns true. Otherwise (taken by the
    // worker or another caller already, an op running, an earlier op still
    // queued, the worker gone) returns false at once, having run nothing.
    // Saves the waiter two thread handoffs (the worker's wake and the
    // completion's) and keeps issue order. Thread-safe.
    bool RunHere() const;

   private:
    friend class OpWorker;
    QueuedOp(std::weak_ptr<State> state, uint64_t id) : state_(std::move(state)), id_(id) {}
    std::weak_ptr<State> state_;
    uint64_t id_ = 0;
  };

  // Queues `op`; `then` (may be empty) runs on the worker right after `op`,
  // once the worker counts as idle. `then` must not touch what ops share.
  // Returns the queued op (empty when the worker has exited and the op ran
  // on the caller).
  QueuedOp Enqueue(std::function<void()> op, std::function<void()> then = nullptr);

  // Runs `op` on the calling thread if no op is queued or running (so issue
  // order is kept), then `then` (may be empty), and returns true; returns
  // false without running either otherwise. Used for latency-bound small
  // ops, where two thread handoffs would cost more than the op.
  bool RunInlineIfIdle(const std::function<void()>& op,
                       const std::function<void()>& then = nullptr);
  // RunInlineIfIdle in two halves, for a caller that runs its op without
  // wrapping it in a std::function: BeginInline() returns true if no op is
  // queued or running and the worker is not stopping, and then counts the caller
  // as the running op; the caller runs the op and calls EndInline() exactly
  // once, then does its `then` step. false: nothing changed; queue the op.
  bool BeginInline();
  void EndInline();

  // Runs `task` on one of the callback threads (completing a Work's future
  // and running its callbacks): never on the worker thread, never behind a
  // callback that blocks. After Stop(), on the caller.
  void Post(std::function<void()> task) { callbacks_.Post(std::move(task)); }
  CallbackThreads* callbacks() { return &callbacks_; }

  // Asks the thread to run the ops queued so far and leave, then waits until
  // it has (every queued op run and its closures released), and then the
  // callback threads likewise, or until `deadline` passes; returns whether
  // all have (a true return means the worker thread has been joined: it no
  // longer exists, e.g. in /proc/self/task). Ops enqueued meanwhile still run on the thread; once it has
  // left, Enqueue() runs them on the calling thread, in call order.
  // Idempotent. Thread-safe; on the worker thread or a callback thread it
  // only asks, and returns false.
  bool Stop(absl::Time deadline) ABSL_LOCKS_EXCLUDED(join_mu_);
  // Whether the caller is the worker thread or one of its callback threads
  // (neither can wait for them).
  bool OnWorkerThread() const {
    return std::this_thread::get_id() == worker_id_ || callbacks_.OnCallbackThread();
  }
  // Ops (queued or inline) finished so far: a caller of Stop() that wants to
  // tell a slow queue from a stuck op compares two readings.
  int64_t ops_done() const;

 private:
  struct Task {
    uint64_t id = 0;  // issue order, from 1
    std::function<void()> op;
    std::function<void()> then;  // may be empty
  };
  struct State {
    absl::Mutex mu;
    absl::CondVar cv;  // with mu: the queue, stop, busy or exited changed
    std::deque<Task> queue ABSL_GUARDED_BY(mu);
    uint64_t last_id ABSL_GUARDED_BY(mu) = 0;  // of the last op queued
    bool stop ABSL_GUARDED_BY(mu) = false;
    bool busy ABSL_GUARDED_BY(mu) = false;    // an op is running (worker or inline)
    bool exited ABSL_GUARDED_BY(mu) = false;  // the thread left Loop (after stop)
    int64_t done ABSL_GUARDED_BY(mu) = 0;     // ops finished
    // Serializes the ops that Enqueue() runs on callers once exited.
    absl::Mutex after_exit_mu;
  };
  // Runs on the worker thread; `state` is kept alive by the thread.
  static void Loop(const std::shared_ptr<State>& state);

  // Declared first: destroyed after the worker thread has been joined, so
  // the completions of the ops it drained still find it.
  CallbackThreads callbacks_;
  std::shared_ptr<State> state_;
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);  // joined (or detached) once
  // The worker thread's id, kept apart from `thread_` so OnWorkerThread()
  // never reads a std::thread that Stop() or the destructor is joining.
  const std::thread::id worker_id_;
  absl::Mutex join_mu_;
};

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_OP_WORKER_H_
