#include "collectives/callback_threads.h"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <utility>

#include "absl/time/clock.h"
#include "collectives/exception_message.h"

namespace tpudist::collectives {
namespace {

// The pool whose thread this is (its State), or null.
thread_local const void* current_pool = nullptr;

// Waits this long in the destructor before leaving the threads to finish on
// their own.
constexpr absl::Duration kDestructorPatience = absl::Seconds(10);

void RunCaught(const std::function<void()>& task, const std::string& name) {
  try {
    task();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpu_dist: %s: an exception escaped a future callback: %s\n",
                 name.c_str(), ExceptionMessage(e).c_str());
  } catch (...) {
    std::fprintf(stderr, "tpu_dist: %s: a non-std exception escaped a future callback\n",
                 name.c_str());
  }
}

}  // namespace

CallbackThreads::CallbackThreads(std::string name, int max_threads)
    : name_(name.substr(0, 15)),
      max_threads_(std::max(1, max_threads)),
      state_(std::make_shared<State>()) {}

CallbackThreads::~CallbackThreads() {
  if (!OnCallbackThread() && Stop(absl::Now() + kDestructorPatience)) return;
  // On a callback thread, or a callback that will not end: the threads keep
  // `state_` alive and leave once the tasks are done.
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  s.stop = true;
  s.work_cv.SignalAll();
  for (std::thread& t : s.threads) t.detach();
  s.threads.clear();
}

void CallbackThreads::Post(std::function<void()> task) {
  State& s = *state_;
  bool closed;
  {
    absl::MutexLock lock(&s.mu);
    closed = s.closed;
    if (!closed) {
      s.tasks.push_back(std::move(task));
      const int running = static_cast<int>(s.threads.size()) - s.exited;
      if (s.idle < static_cast<int>(s.tasks.size()) && running < max_threads_) {
        // Every thread is busy (perhaps blocked in a callback): one more, so
        // this task does not wait for theirs. It counts as idle from now on.
        ++s.idle;
        s.threads.emplace_back([st = state_, n = name_] {
          pthread_setname_np(pthread_self(), n.c_str());
          current_pool = st.get();
          Loop(st, n);
        });
        return;  // the new thread finds the task without a signal
      }
    }
  }
  if (closed) {
    RunCaught(task, name_);
    return;
  }
  s.work_cv.Signal();
}

bool CallbackThreads::Stop(absl::Time deadline) {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  s.stop = true;
  s.work_cv.SignalAll();
  if (OnCallbackThread()) return false;
  while (s.exited < static_cast<int>(s.threads.size())) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    s.exit_cv.WaitWithTimeout(&s.mu, std::min(left, absl::Seconds(1)));
  }
  // Every thread has returned from Loop and needs `mu` no more.
  for (std::thread& t : s.threads) t.join();
  s.threads.clear();
  s.exited = 0;
  s.closed = true;
  return true;
}

bool CallbackThreads::OnCallbackThread() const {
  return current_pool == state_.get();
}

int CallbackThreads::threads() const {
  State& s = *state_;
  absl::MutexLock lock(&s.mu);
  return static_cast<int>(s.threads.size()) - s.exited;
}

void CallbackThreads::Loop(const std::shared_ptr<State>& state, const std::string& name) {
  State& s = *state;
  absl::MutexLock lock(&s.mu);
  while (true) {
    // Counted in s.idle here, until a task or stop.
    while (s.tasks.empty() && !s.stop) s.work_cv.Wait(&s.mu);
    if (s.tasks.empty()) {  // stopped and drained
      --s.idle;
      ++s.exited;
      s.exit_cv.SignalAll();
      return;
    }
    std::function<void()> task = std::move(s.tasks.front());
    s.tasks.pop_front();
    --s.idle;
    s.mu.Unlock();
    RunCaught(task, name);
    task = nullptr;  // its captures (tensors, Python objects) go here, unlocked
    s.mu.Lock();
    ++s.idle;
  }
}

}  // namespace tpudist::collectives
