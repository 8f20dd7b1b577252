// The reduction kernels alone (collectives/core/reduce_kernels.h,
// bf16_reduce.h), no communication: how fast one rank folds a received
// buffer into its own (ReduceInPlace, the TCP ring's step and the shm
// all-reduce's fold at world 2) and reduces 4 inputs out of place (the shm
// all-reduce at world 4), fp32 and bf16 of the same bytes, each runnable bf16
// path forced, and memcpy of the same bytes as the memory-bound reference --
// all in one run, then one table of GB/s (buffer bytes / time) and the
// bf16/fp32 time ratios, with the load average before and after.
//
//   reduce_kernels_bench                       # 16 MiB
//   reduce_kernels_bench --bytes=1048576       # another size
//   reduce_kernels_bench --quick               # ctest smoke: 64 KiB
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench/flag_value.h"
#include "bench/proc_stats.h"
#include "collectives/core/bf16_reduce.h"
#include "collectives/core/reduce_kernels.h"

namespace {

using tpudist::bench::LoadAverage;

namespace tc = tpudist::collectives;
using Clock = std::chrono::steady_clock;

// Registers `name`, timing `body` over a fixed iteration count; the seconds
// per call land in (*seconds)[name]. `seconds` outlives the run.
template <typename Body>
void Register(const std::string& name, int64_t iters, Body body,
              std::map<std::string, double>* seconds) {
  benchmark::RegisterBenchmark(name.c_str(), [name, body, seconds](benchmark::State& state) {
    body();  // warm-up: page faults, caches
    const Clock::time_point start = Clock::now();
    for (auto _ : state) body();
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    (*seconds)[name] = s / static_cast<double>(state.iterations());
  })->Iterations(iters)->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t bytes = 16 << 20;
  tpudist::bench::StripFlags(&argc, argv, [&](const std::string& a) {
    if (const char* v = tpudist::bench::FlagValue(a, "--bytes=")) bytes = std::stoll(v);
    else if (a == "--quick") bytes = 64 << 10;
    else return false;
    return true;
  });
  benchmark::Initialize(&argc, argv);
  const double load_before = LoadAverage();
  const int64_t iters = std::max<int64_t>(8, (int64_t{256} << 20) / bytes);
  // Four input buffers per dtype: [bytes / element size] each.
  std::map<std::string, std::vector<at::Tensor>> bufs;
  for (auto [name, type] : {std::pair{"fp32", at::kFloat}, std::pair{"bf16", at::kBFloat16}}) {
    const int64_t numel = bytes / static_cast<int64_t>(c10::elementSize(type));
    for (int k = 0; k < 5; ++k) bufs[name].push_back(at::randn({numel}).to(type));
  }
  const tc::CpuFeatures cpu = tc::DetectCpuFeatures();
  std::vector<std::string> order;
  std::map<std::string, double> seconds;  // by case name
  auto add = [&](const std::string& name, auto body) {
    order.push_back(name);
    Register(name, iters, body, &seconds);
  };
  add("memcpy", [&] {
    std::memcpy(bufs["fp32"][0].data_ptr(), bufs["fp32"][1].data_ptr(), bytes);
  });
  for (auto [name, dt] : {std::pair{"fp32", tc::DataType::kFloat32},
                          std::pair{"bf16", tc::DataType::kBFloat16}}) {
    std::vector<at::Tensor>& b = bufs[name];
    const int64_t n = b[0].numel();
    add(std::string(name) + "/inplace2", [&b, dt, n] {
      tc::ReduceInPlace(dt, tc::ReduceKind::kSum, b[0].data_ptr(), b[1].data_ptr(), n);
    });
    add(std::string(name) + "/into4", [&b, dt, n] {
      const void* ins[4] = {b[1].data_ptr(), b[2].data_ptr(), b[3].data_ptr(), b[4].data_ptr()};
      tc::ReduceInto(dt, tc::ReduceKind::kSum, b[0].data_ptr(), ins, n);
    });
  }
  for (tc::Bf16Path p : {tc::Bf16Path::kPortable, tc::Bf16Path::kAvx2, tc::Bf16Path::kAvx512Bf16}) {
    if (!tc::Bf16PathRunnable(p, cpu)) continue;
    std::vector<at::Tensor>& b = bufs["bf16"];
    const int64_t n = b[0].numel();
    add("bf16/inplace2/" + std::string(tc::Bf16PathName(p)), [&b, p, n] {
      const void* ins[2] = {b[0].data_ptr(), b[1].data_ptr()};
      tc::ReduceBf16(p, tc::ReduceKind::kSum, b[0].data_ptr(), ins, n);
    });
  }
  benchmark::RunSpecifiedBenchmarks();
  const double load_after = LoadAverage();
  std::printf("\n== reduce kernels, %lld bytes per buffer, default bf16 path %s "
              "(load average %.2f -> %.2f) ==\n",
              static_cast<long long>(bytes),
              std::string(tc::Bf16PathName(tc::DefaultBf16Path())).c_str(), load_before,
              load_after);
  std::printf("%-28s %10s %8s %14s\n", "case", "us", "GB/s", "vs fp32 same");
  bool measured = true;
  for (const std::string& name : order) {
    const double s = seconds.count(name) ? seconds[name] : -1;
    measured = measured && s > 0;
    std::string ratio = "";
    if (name.rfind("bf16/", 0) == 0) {
      const std::string shape = name.substr(5, name.find('/', 5) - 5);
      const double f = seconds.count("fp32/" + shape) ? seconds["fp32/" + shape] : -1;
      if (f > 0 && s > 0) ratio = std::to_string(s / f).substr(0, 5) + "x time";
    }
    std::printf("%-28s %10.1f %8.2f %14s\n", name.c_str(), s * 1e6, bytes / s / 1e9,
                ratio.c_str());
  }
  benchmark::Shutdown();
  if (!measured) std::fprintf(stderr, "reduce_kernels_bench: a case measured nothing\n");
  return measured ? 0 : 1;
}
