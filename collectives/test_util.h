// Test helpers for collectives_test: ranks as threads over a HashStore, ranks
// as forked processes over a FileStore, group factories (ours and Gloo's),
// and /dev/shm inspection. Test-only; not part of the library.
#ifndef TPU_DIST_COLLECTIVES_TEST_UTIL_H_
#define TPU_DIST_COLLECTIVES_TEST_UTIL_H_

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/process_group_tpu_dist.h"
#include "gtest/gtest.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"

namespace tpudist::collectives::testing {

// Runs work->wait(timeout) and returns the error message ("" if it
// succeeded).
inline std::string ErrorOf(const c10::intrusive_ptr<c10d::Work>& work,
                           std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  try {
    work->wait(timeout);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Seconds elapsed since `t`.
inline double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Small slots so that modest tensors exercise the chunked paths.
inline ProcessGroupTpuDist::Options SmallOptions(const std::string& job) {
  ProcessGroupTpuDist::Options o;
  o.timeout = std::chrono::seconds(20);
  o.job_id = job;
  o.shm_slot_bytes = 4096;
  o.small_allreduce_bytes = 1024;
  o.inline_max_bytes = 1024;  // tiny ops inline, the rest on the worker
  return o;
}

inline std::string UniqueJob(const std::string& tag) {
  static int counter = 0;
  return tag + std::to_string(getpid()) + "x" + std::to_string(++counter);
}

// Runs fn(rank) on `world` threads and joins them. Ops inside have deadlines,
// so joins are bounded by the op timeouts.
inline void RunThreads(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&fn, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << " threw: " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
}

inline c10::intrusive_ptr<c10d::ProcessGroupGloo> MakeGloo(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world) {
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->timeout = std::chrono::seconds(60);
  opts->devices.push_back(
      c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>("gloo", store), rank, world, opts);
}

// Forks `world` children running fn(rank) (its return value is the exit
// code) and waits at most `timeout` for all of them; stragglers are killed
// and reported as -1. on_started(pids) runs in the parent after forking.
inline std::vector<int> RunForked(
    int world, const std::function<int(int)>& fn, std::chrono::seconds timeout,
    const std::function<void(const std::vector<pid_t>&)>& on_started = nullptr) {
  std::vector<pid_t> pids(world);
  for (int r = 0; r < world; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      int code = 99;
      try {
        code = fn(r);
      } catch (const std::exception& e) {
        fprintf(stderr, "rank %d threw: %s\n", r, e.what());
        code = 98;
      }
      _exit(code);
    }
  }
  if (on_started) on_started(pids);
  std::vector<int> codes(world, -1);
  std::vector<bool> done(world, false);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int left = world;
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    for (int r = 0; r < world; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < world; ++r) {
    if (!done[r]) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], nullptr, 0);
    }
  }
  return codes;
}

// Names in /dev/shm that start with `prefix`.
inline std::vector<std::string> ShmEntries(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* dir = opendir("/dev/shm");
  if (!dir) return out;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  closedir(dir);
  return out;
}

inline std::string TempDir() {
  char tmpl[] = "/tmp/tpud_test_XXXXXX";
  return mkdtemp(tmpl);
}

}  // namespace tpudist::collectives::testing

#endif  // TPU_DIST_COLLECTIVES_TEST_UTIL_H_
