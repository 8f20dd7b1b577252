// Threads that complete a group's Work futures, and so run the callbacks
// users chain on them (Future.then, add_done_callback, DDP comm hooks), off
// the op worker's thread.
//
// Why: a callback may issue a collective and wait for it (DDP's PowerSGD
// hook does, twice per bucket). Run on the op worker, the nested op queues
// behind the op whose completion is running the callback: a deadlock, with no
// deadline to end it. Run here, the worker goes on with the queue.
//
// Contract: tasks start in Post() order, and a task never waits for an
// earlier one to finish: when no thread is idle, Post() starts another (up to
// `max_threads`; beyond that, tasks wait for a free thread). So a callback
// that blocks on a nested op's future, whose completion is posted after it,
// is released by a second thread. Threads are started on demand (a group
// whose futures nobody asks for starts none) and stay until Stop() or
// destruction. An exception escaping a task is caught and written to stderr;
// the thread lives on.
// Stop() lets the threads finish every task posted before or meanwhile and
// leave; once they all have, Post() runs tasks on the calling thread.
// The destructor stops the threads and waits (bounded) for them; on a
// callback thread itself (a callback dropped the last reference to the
// group) it cannot, and the threads, which share their state, leave on their
// own.
//
// Thread-safety: all methods are thread-safe.
#ifndef TPU_DIST_COLLECTIVES_CALLBACK_THREADS_H_
#define TPU_DIST_COLLECTIVES_CALLBACK_THREADS_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tpudist::collectives {

class CallbackThreads {
 public:
  static constexpr int kDefaultMaxThreads = 64;

  // `name` names the threads (truncated to 15 characters).
  explicit CallbackThreads(std::string name, int max_threads = kDefaultMaxThreads);
  CallbackThreads(const CallbackThreads&) = delete;
  CallbackThreads& operator=(const CallbackThreads&) = delete;
  ~CallbackThreads();

  // Runs `task` on a callback thread (see the contract above); after a
  // successful Stop(), on the caller before returning.
  void Post(std::function<void()> task);

  // Lets the threads run what is posted and leave; waits until they all
  // have or `deadline` passes; returns whether they have. Idempotent. On a
  // callback thread it only asks, and returns false.
  bool Stop(absl::Time deadline);

  // Whether the caller is one of these threads.
  bool OnCallbackThread() const;
  // Threads started and not yet joined.
  int threads() const;

 private:
  struct State {
    absl::Mutex mu;
    absl::CondVar work_cv;  // with mu: a task or stop, for the threads
    absl::CondVar exit_cv;  // with mu: a thread left, for Stop()
    std::deque<std::function<void()>> tasks ABSL_GUARDED_BY(mu);
    std::vector<std::thread> threads ABSL_GUARDED_BY(mu);
    int idle ABSL_GUARDED_BY(mu) = 0;        // threads waiting for a task
    int exited ABSL_GUARDED_BY(mu) = 0;      // threads that left Loop
    bool stop ABSL_GUARDED_BY(mu) = false;
    bool closed ABSL_GUARDED_BY(mu) = false;  // every thread left and was joined
  };
  // Runs on each thread; `state` is kept alive by the thread.
  static void Loop(const std::shared_ptr<State>& state, const std::string& name);

  const std::string name_;
  const int max_threads_;
  std::shared_ptr<State> state_;
};

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_CALLBACK_THREADS_H_
