#include "testing/rank_threads.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <future>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace tpudist::test_support {

std::vector<RankError> RunRankThreads(int world, const std::function<void(int rank)>& body,
                                      absl::Duration deadline) {
  absl::Mutex mu;
  std::vector<RankError> errors;  // guarded by mu
  std::vector<std::future<void>> done;
  std::vector<std::thread> threads;
  done.reserve(world);
  threads.reserve(world);
  for (int r = 0; r < world; ++r) {
    auto task = std::make_shared<std::packaged_task<void()>>([&body, &mu, &errors, r] {
      std::string what;
      bool threw = false;
      try {
        body(r);
      } catch (const std::exception& e) {
        threw = true;
        what = e.what();
      } catch (...) {
        threw = true;
        what = "a non-std::exception";
      }
      if (threw) {
        ADD_FAILURE() << "rank " << r << " threw: " << what;
        absl::MutexLock lock(&mu);
        errors.push_back(RankError{r, what});
      }
    });
    done.push_back(task->get_future());
    threads.emplace_back([task] { (*task)(); });
  }
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(absl::ToInt64Milliseconds(deadline));
  std::string hung;
  for (int r = 0; r < world; ++r) {
    if (done[r].wait_until(until) != std::future_status::ready) {
      absl::StrAppend(&hung, hung.empty() ? "" : ", ", r);
    }
  }
  if (!hung.empty()) {
    std::fprintf(stderr, "RunRankThreads: rank(s) %s of %d still running after %s: hang, aborting\n",
                 hung.c_str(), world, absl::FormatDuration(deadline).c_str());
    std::fflush(stderr);
    std::abort();
  }
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&mu);
  std::sort(errors.begin(), errors.end(),
            [](const RankError& a, const RankError& b) { return a.rank < b.rank; });
  return errors;
}

}  // namespace tpudist::test_support
