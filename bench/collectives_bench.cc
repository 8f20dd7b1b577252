// all_reduce latency / bandwidth of the tpu_dist process group against Gloo
// and against a plain memcpy of the same bytes (the memory-bound limit).
//
// One run forks --world ranks (default 2) over a FileStore; every rank runs
// the same benchmarks with fixed iteration counts so that the collectives
// line up, and only rank 0 reports. At the end rank 0 prints the ratios:
//   gloo / tpu_dist time (higher is better for tpu_dist)
//   memcpy / tpu_dist time (fraction of the memory-bound limit reached)
//
//   collectives_bench                 # 2 ranks
//   collectives_bench --world=4       # scaling check
//   collectives_bench --smoke         # a couple of iterations (ctest)
//   collectives_bench --slot_bytes=N --slots=K  # shm slot experiments
//   collectives_bench --spin=N --yield=M  # wait back-off experiment
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "collectives/process_group_tpu_dist.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"

namespace {

using tpudist::collectives::ProcessGroupTpuDist;
using Clock = std::chrono::steady_clock;

struct Flags {
  int world = 2;
  bool smoke = false;
  int64_t slot_bytes = 0;  // 0: the group's default
  int slots = 0;           // 0: the group's default
  int spin = -1;           // -1: the group's default
  int yield = -1;
};

// Everything one rank needs; owned by main, captured by the benchmarks.
struct Env {
  int rank = 0;
  int world = 2;
  bool smoke = false;
  c10::intrusive_ptr<ProcessGroupTpuDist> ours;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  std::map<std::string, double> seconds_per_iter;  // by benchmark name
};

Flags ParseAndStrip(int* argc, char** argv) {
  Flags f;
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--world=", 0) == 0) {
      f.world = std::stoi(a.substr(8));
    } else if (a.rfind("--slot_bytes=", 0) == 0) {
      f.slot_bytes = std::stoll(a.substr(13));
    } else if (a.rfind("--slots=", 0) == 0) {
      f.slots = std::stoi(a.substr(8));
    } else if (a.rfind("--spin=", 0) == 0) {
      f.spin = std::stoi(a.substr(7));
    } else if (a.rfind("--yield=", 0) == 0) {
      f.yield = std::stoi(a.substr(8));
    } else if (a == "--smoke") {
      f.smoke = true;
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  return f;
}

int64_t Iterations(const Env& env, int64_t bytes, bool gloo) {
  if (env.smoke) return 2;
  if (bytes <= 1024) return gloo ? 300 : 3000;
  return gloo ? 5 : 30;
}

// Runs `op` once per benchmark iteration; records mean seconds / iteration.
template <typename Op>
void Measure(benchmark::State& state, Env& env, const std::string& name,
             int64_t bytes, Op op) {
  const auto start = Clock::now();
  for (auto _ : state) op();
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  env.seconds_per_iter[name] = secs / std::max<int64_t>(state.iterations(), 1);
  state.SetBytesProcessed(state.iterations() * bytes);
}

void Register(Env& env, int64_t bytes, const std::string& size_name) {
  const int64_t numel = std::max<int64_t>(bytes / 4, 1);
  const std::string suffix = "/" + size_name + "/world" + std::to_string(env.world);
  for (const std::string kind : {"tpu_dist", "gloo", "memcpy"}) {
    const std::string name = "allreduce_" + kind + suffix;
    auto* b = benchmark::RegisterBenchmark(
        name.c_str(), [&env, name, kind, numel, bytes](benchmark::State& state) {
          std::vector<at::Tensor> t = {at::ones({numel}, at::kFloat)};
          at::Tensor dst = at::empty({numel}, at::kFloat);
          if (kind == "tpu_dist") {
            Measure(state, env, name, bytes, [&] { env.ours->allreduce(t)->wait(); });
          } else if (kind == "gloo") {
            Measure(state, env, name, bytes, [&] { env.gloo->allreduce(t)->wait(); });
          } else {
            Measure(state, env, name, bytes, [&] {
              std::memcpy(dst.data_ptr(), t[0].data_ptr(), bytes);
              benchmark::DoNotOptimize(dst.data_ptr());
              benchmark::ClobberMemory();
            });
          }
        });
    b->Iterations(Iterations(env, bytes, kind == "gloo"))->UseRealTime()->Unit(
        benchmark::kMicrosecond);
  }
}

void PrintRatios(const Env& env) {
  const std::string w = "/world" + std::to_string(env.world);
  auto get = [&](const std::string& kind, const std::string& size) {
    auto it = env.seconds_per_iter.find("allreduce_" + kind + "/" + size + w);
    return it == env.seconds_per_iter.end() ? 0.0 : it->second;
  };
  std::printf("\n== tpu_dist all_reduce, %d ranks (fp32) ==\n", env.world);
  for (const std::string size : {"8B", "16MiB"}) {
    const double ours = get("tpu_dist", size), gloo = get("gloo", size),
                 copy = get("memcpy", size);
    if (ours <= 0) continue;
    std::printf("%-6s tpu_dist %10.2f us | gloo %10.2f us | memcpy %9.2f us | "
                "gloo/tpu_dist %6.1fx | memcpy/tpu_dist %5.1f%%\n",
                size.c_str(), ours * 1e6, gloo * 1e6, copy * 1e6, gloo / ours,
                100.0 * copy / ours);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = ParseAndStrip(&argc, argv);
  benchmark::Initialize(&argc, argv);
  char dir_template[] = "/tmp/tpud_bench_XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  Env env;
  env.world = flags.world;
  env.smoke = flags.smoke;
  const std::string job = "bench" + std::to_string(getpid());
  std::vector<pid_t> children;
  for (int r = 1; r < flags.world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      env.rank = r;
      break;
    }
    children.push_back(pid);
  }
  if (env.rank != 0) {  // followers run silently
    const int null_fd = open("/dev/null", O_WRONLY);
    dup2(null_fd, STDOUT_FILENO);
  }
  auto store = c10::make_intrusive<c10d::FileStore>(dir + "/store", flags.world);
  ProcessGroupTpuDist::Options options;
  options.timeout = std::chrono::seconds(120);
  options.job_id = job;
  if (flags.slot_bytes > 0) options.shm_slot_bytes = flags.slot_bytes;
  if (flags.slots > 0) options.shm_num_slots = flags.slots;
  if (flags.spin >= 0) options.wait.spin_iters = flags.spin;
  if (flags.yield >= 0) options.wait.yield_iters = flags.yield;
  env.ours = c10::make_intrusive<ProcessGroupTpuDist>(store, env.rank, flags.world, options);
  auto gloo_opts = c10d::ProcessGroupGloo::Options::create();
  gloo_opts->timeout = std::chrono::seconds(120);
  gloo_opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  env.gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>("gloo", store), env.rank, flags.world,
      gloo_opts);
  Register(env, 8, "8B");
  Register(env, 16 << 20, "16MiB");
  benchmark::RunSpecifiedBenchmarks();
  env.ours->barrier()->wait();
  if (env.rank != 0) {
    env.gloo.reset();
    env.ours.reset();
    _exit(0);
  }
  PrintRatios(env);
  benchmark::Shutdown();
  int failures = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (pid_t pid : children) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
  }
  env.gloo.reset();
  env.ours.reset();
  return failures == 0 ? 0 : 1;
}
