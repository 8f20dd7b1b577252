// A single worker thread that runs a process group's ops in issue order, so
// that c10d calls return immediately (async Work) and communication overlaps
// the caller's compute.
//
// Contract: Enqueue() never blocks on the op; ops run one at a time, FIFO
// (inline ops included).
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
// Thread-safety: Enqueue() and RunInlineIfIdle() are thread-safe.
#ifndef TPU_DIST_COLLECTIVES_OP_WORKER_H_
#define TPU_DIST_COLLECTIVES_OP_WORKER_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <memory>
#include <string>
#include <thread>
#include <utility>

namespace tpudist::collectives {

class OpWorker {
 public:
  // `name` names the thread (pthread_setname_np: ps, top -H, gdb, perf);
  // truncated to 15 characters.
  explicit OpWorker(const std::string& name = "tpud-op");
  OpWorker(const OpWorker&) = delete;
  OpWorker& operator=(const OpWorker&) = delete;
  ~OpWorker();

  // Queues `op`; `then` (may be empty) runs on the worker right after `op`,
  // once the worker counts as idle. `then` must not touch what ops share.
  void Enqueue(std::function<void()> op, std::function<void()> then = nullptr);

  // Runs `op` on the calling thread if no op is queued or running (so issue
  // order is kept), then `then` (may be empty), and returns true; returns
  // false without running either otherwise. Used for latency-bound small
  // ops, where two thread handoffs would cost more than the op.
  bool RunInlineIfIdle(const std::function<void()>& op,
                       const std::function<void()>& then = nullptr);

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    // (op, then) pairs.
    std::deque<std::pair<std::function<void()>, std::function<void()>>> queue;  // GUARDED_BY(mu)
    bool stop = false;                        // GUARDED_BY(mu)
    bool busy = false;  // an op is running (worker or inline); GUARDED_BY(mu)
  };
  // Runs on the worker thread; `state` is kept alive by the thread.
  static void Loop(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_OP_WORKER_H_
