// A single worker thread that runs a process group's ops in issue order, so
// that c10d calls return immediately (async Work) and communication overlaps
// the caller's compute.
//
// Contract: Enqueue() never blocks on the op; ops run one at a time, FIFO
// (inline ops included).
// The destructor stops accepting ops, drains the queue (each op is bounded by
// its own deadline) and joins.
//
// Thread-safety: Enqueue() and RunInlineIfIdle() are thread-safe.
#ifndef TPU_DIST_COLLECTIVES_OP_WORKER_H_
#define TPU_DIST_COLLECTIVES_OP_WORKER_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace tpudist::collectives {

class OpWorker {
 public:
  OpWorker();
  OpWorker(const OpWorker&) = delete;
  OpWorker& operator=(const OpWorker&) = delete;
  ~OpWorker();

  void Enqueue(std::function<void()> op);

  // Runs `op` on the calling thread if no op is queued or running (so issue
  // order is kept) and returns true; returns false without running it
  // otherwise. Used for latency-bound small ops, where two thread handoffs
  // would cost more than the op.
  bool RunInlineIfIdle(const std::function<void()>& op);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // GUARDED_BY(mu_)
  bool stop_ = false;                        // GUARDED_BY(mu_)
  bool busy_ = false;  // an op is running (worker or inline); GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_OP_WORKER_H_
