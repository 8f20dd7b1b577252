// Test helpers for collectives_test: forked ranks over a FileStore (on
// testing/forked_ranks.h; ranks as threads: testing/rank_threads.h), group
// options and factories (ours and Gloo's), shm op specs and all_to_all
// buffers, and /dev/shm inspection. Header-only. Test-only; not part of the
// library.
#ifndef TPU_DIST_TESTING_COLLECTIVES_UTIL_H_
#define TPU_DIST_TESTING_COLLECTIVES_UTIL_H_

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ATen/Parallel.h"
#include "absl/time/time.h"
#include "collectives/core/op_header.h"
#include "collectives/process_group_tpu_dist.h"
#include "collectives/shm/communicator.h"
#include "gtest/gtest.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"
#include "testing/forked_ranks.h"
#include "testing/rank_threads.h"
#include "testing/temp_dir.h"

namespace tpudist::test_support {

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
inline collectives::ProcessGroupTpuDist::Options SmallOptions(const std::string& job) {
  collectives::ProcessGroupTpuDist::Options o;
  o.timeout = std::chrono::seconds(20);
  o.job_id = job;
  o.shm_slot_bytes = 4096;
  o.small_allreduce_bytes = 1024;
  o.inline_max_bytes = 1024;  // tiny ops inline, the rest on the worker
  return o;
}

// The spec of an op named `name` on [count] elements of `type`, sequence
// number `seq`, starting now with a 60 s timeout: for calling the shm
// algorithms directly.
inline collectives::OpSpec ShmOpSpec(uint32_t seq, const char* name, collectives::DataType type,
                                     int64_t count) {
  collectives::OpSpec spec;
  spec.ctx.name = name;
  spec.ctx.start = absl::Now();
  spec.ctx.timeout = absl::Seconds(60);
  spec.seq = seq;
  spec.dtype = type;
  spec.shape = {count};
  spec.count = count;
  return spec;
}

// One rank's buffers of an all_to_all with byte counts bytes(src, dst) and
// content value(src, dst, i): send[j] holds this rank's block for rank j,
// recv[j] (zeroed) receives rank j's block; each buffer has one guard byte
// past the block (0). ins / outs / in_bytes / out_bytes are the shm
// AllToAll's arguments.
struct AllToAllBuffers {
  std::vector<std::vector<char>> send, recv;
  std::vector<const void*> ins;
  std::vector<void*> outs;
  std::vector<int64_t> in_bytes, out_bytes;
  // Bytes of recv[src] that differ from value(src, rank, i), plus 1 if the
  // guard byte was written.
  template <typename Value>
  int64_t Mismatches(int rank, int src, Value value) const {
    int64_t bad = recv[src][out_bytes[src]] != 0;
    for (int64_t i = 0; i < out_bytes[src]; ++i) bad += recv[src][i] != value(src, rank, i);
    return bad;
  }
};
template <typename Bytes, typename Value>
AllToAllBuffers MakeAllToAllBuffers(int world, int rank, Bytes bytes, Value value) {
  AllToAllBuffers b;
  b.send.resize(world);
  b.recv.resize(world);
  b.ins.resize(world);
  b.outs.resize(world);
  b.in_bytes.resize(world);
  b.out_bytes.resize(world);
  for (int j = 0; j < world; ++j) {
    b.in_bytes[j] = bytes(rank, j);
    b.out_bytes[j] = bytes(j, rank);
    b.send[j].assign(b.in_bytes[j] + 1, 0);
    for (int64_t i = 0; i < b.in_bytes[j]; ++i) b.send[j][i] = value(rank, j, i);
    b.recv[j].assign(b.out_bytes[j] + 1, 0);
    b.ins[j] = b.send[j].data();
    b.outs[j] = b.recv[j].data();
  }
  return b;
}

// shm::Communicator::Create for a test rank, 60 s setup timeout; null (and
// a test failure) when it fails.
inline std::unique_ptr<collectives::shm::Communicator> CreateShmComm(
    c10d::Store& store, int rank, int world, collectives::shm::CommOptions options) {
  options.setup_timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<collectives::shm::Communicator>> comm =
      collectives::shm::Communicator::Create(store, rank, world, options);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? std::move(*comm) : nullptr;
}

inline std::string UniqueJob(const std::string& tag) {
  static int counter = 0;
  return tag + std::to_string(getpid()) + "x" + std::to_string(++counter);
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
// and reported as -1, a child a signal ended as 128 + the signal
// (testing/forked_ranks.h). on_started(pids) runs in the parent after forking.
// Children run ATen ops on one intra-op thread (see below).
inline std::vector<int> RunForked(
    int world, const std::function<int(int)>& fn, std::chrono::seconds timeout,
    const std::function<void(const std::vector<pid_t>&)>& on_started = nullptr) {
  ForkOptions options;
  options.deadline = absl::Seconds(timeout.count());
  options.on_started = on_started;
  const std::vector<ChildResult> results = RunForkedRanks(
      world,
      [&fn](int rank, std::string*) {
        // The parent may have run OpenMP regions (earlier tests in this
        // process, without OMP_NUM_THREADS=1): libgomp's pool does not survive
        // fork, and a child entering a parallel region would wait for it
        // forever. One intra-op thread in the child keeps ATen off it.
        at::set_num_threads(1);
        return fn(rank);
      },
      options);
  std::vector<int> codes;
  for (const ChildResult& r : results) {
    codes.push_back(ExitStatusCode(r));
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

}  // namespace tpudist::test_support

#endif  // TPU_DIST_TESTING_COLLECTIVES_UTIL_H_
