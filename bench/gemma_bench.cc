// gemma_bench: forward+backward throughput of a bench-sized Gemma 4 text
// decoder (hidden 512, the tiny model's architecture otherwise) on one rank
// (CPU, at::get_num_threads() threads) and its model-FLOPs utilisation (MFU)
// against GEMMs measured in the same run.
//
//   gemma_bench                 # full run: bf16 and fp32 models, batch 2 x seq 256
//   gemma_bench --threads=1     # one intra-op thread (CPU-time MFU without spinning workers)
//   gemma_bench --smoke         # one short iteration each (ctest)
//
// MFU = achieved model FLOP/s / GEMM FLOP/s, where model FLOPs per step are
// 6 * (matmul parameters, incl. the tied lm_head) * tokens plus the attention
// matmuls 12 * layers * B * H * S^2 * D (fwd 4, bwd 8), and the GEMM rate is
// at::matmul on [1024, 1024] x [1024, 1024] timed right after each model case
// in the same process, in bf16 and in fp32. Each model case reports MFU
// against both; the goal is the bf16 model against the bf16 GEMM,
// the fp32 model against the fp32 GEMM is the like-for-like fp32 figure. The
// load average is printed before and after.
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "bench/flag_value.h"
#include "bench/proc_stats.h"
#include "models/gemma/gemma_config.h"
#include "models/gemma/gemma_model.h"

namespace {

using tpudist::bench::LoadAverage;
using tpudist::bench::ProcessCpuSeconds;

namespace g = tpudist::models::gemma;

bool g_smoke = false;  // set once in main from --smoke, read-only afterwards

// Rates by wall time and by this process's CPU time (all threads): on a
// shared machine the wall-time rates of the model and of the GEMM, timed a
// few seconds apart, see different shares of the cores; the CPU-time rates
// do not (run with --threads=1 so no idle OpenMP worker spins).
struct Rate {
  double wall = 0, cpu = 0;  // FLOP per wall second, per CPU second
};
struct CaseResult {
  Rate model, gemm_bf16, gemm_fp32;
  double step_s = 0;
};
std::map<std::string, CaseResult> g_results;  // by case label; main thread only

// A bench-sized config of the same architecture as the tiny one.
g::GemmaConfig BenchConfig() {
  g::GemmaConfig c = g::GemmaTinyConfig();
  c.hidden_size = 512;
  c.intermediate_size = 2048;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 1;
  c.head_dim = 64;
  c.global_head_dim = 128;
  c.vocab_size = 4096;
  c.vocab_size_per_layer_input = 4096;
  c.hidden_size_per_layer_input = 64;
  c.sliding_window = 128;
  return c;
}

// Matmul parameters (embedding lookups excluded, tied lm_head included).
double MatmulParams(g::GemmaForCausalLMImpl& model) {
  double n = 0;
  for (const auto& p : model.named_parameters(true)) {
    const std::string& name = p.key();
    if (p.value().dim() != 2 || name.find("embed_tokens") != std::string::npos) continue;
    n += static_cast<double>(p.value().numel());
  }
  return n + static_cast<double>(model.config().vocab_size * model.config().hidden_size);
}

double StepFlops(g::GemmaForCausalLMImpl& model, int64_t b, int64_t s) {
  const g::GemmaConfig& c = model.config();
  double attn = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    attn += 12.0 * b * c.num_attention_heads * static_cast<double>(s) * s * c.HeadDim(i);
  }
  return 6.0 * MatmulParams(model) * b * s + attn;
}

// FLOP/s of [n, n] x [n, n] in `dtype`: one warm-up, then at least 3
// iterations and 0.3 s (1 iteration in smoke mode).
Rate MeasureGemmFlops(at::ScalarType dtype, int64_t n = 1024) {
  at::Tensor a = at::randn({n, n}).to(dtype);
  at::Tensor w = at::randn({n, n}).to(dtype);
  at::matmul(a, w);  // warm up
  const double cpu0 = ProcessCpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  int iters = 0;
  double sec = 0;
  do {
    benchmark::DoNotOptimize(at::matmul(a, w).data_ptr());
    ++iters;
    sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (!g_smoke && (iters < 3 || sec < 0.3));
  const double flops = 2.0 * n * n * n * iters;
  return Rate{flops / sec, flops / (ProcessCpuSeconds() - cpu0)};
}

// range(0): 1 for bf16 else fp32.
void BM_Gemm(benchmark::State& state) {
  const int64_t n = 1024;
  const at::ScalarType dtype = state.range(0) == 1 ? at::kBFloat16 : at::kFloat;
  at::Tensor a = at::randn({n, n}).to(dtype);
  at::Tensor w = at::randn({n, n}).to(dtype);
  for (auto _ : state) benchmark::DoNotOptimize(at::matmul(a, w).data_ptr());
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(dtype == at::kBFloat16 ? "bf16" : "fp32");
}

// range(0): seq len, range(1): 1 for bf16 else fp32. One untimed warm-up
// step, then the benchmark's fixed iterations.
void BM_GemmaFwdBwd(benchmark::State& state) {
  const int64_t b = 2, s = g_smoke ? 32 : state.range(0);
  const bool bf16 = state.range(1) == 1;
  g::GemmaForCausalLM model(BenchConfig());
  g::InitGemmaWeights(*model, {0, 0.02, 1.0});
  if (bf16) model->to(at::kBFloat16);
  at::Tensor ids = at::randint(3, BenchConfig().vocab_size, {b, s}, at::kLong);
  auto step = [&] {
    g::CausalLMOutput out = model->forward(ids, at::Tensor(), ids);
    out.loss.backward();
    model->zero_grad();
  };
  step();
  const double cpu0 = ProcessCpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) step();
  const double iters = static_cast<double>(std::max<int64_t>(state.iterations(), 1));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  const double cpu_secs = (ProcessCpuSeconds() - cpu0) / iters;
  const double flops = StepFlops(*model, b, s);
  CaseResult r;
  r.step_s = secs;
  r.model = Rate{flops / secs, flops / cpu_secs};
  r.gemm_bf16 = MeasureGemmFlops(at::kBFloat16);
  r.gemm_fp32 = MeasureGemmFlops(at::kFloat);
  g_results[std::string(bf16 ? "bf16" : "fp32") + " model, seq " + std::to_string(s)] = r;
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(b * s), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["model_FLOP/s"] = r.model.wall;
  state.counters["gemm_bf16_FLOP/s"] = r.gemm_bf16.wall;
  state.counters["gemm_fp32_FLOP/s"] = r.gemm_fp32.wall;
  state.counters["MFU_vs_bf16"] = r.model.wall / r.gemm_bf16.wall;
  state.counters["MFU_vs_fp32"] = r.model.wall / r.gemm_fp32.wall;
  state.counters["MFU_cpu_vs_bf16"] = r.model.cpu / r.gemm_bf16.cpu;
  state.counters["MFU_cpu_vs_fp32"] = r.model.cpu / r.gemm_fp32.cpu;
}

}  // namespace

BENCHMARK(BM_Gemm)->Arg(1)->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmaFwdBwd)
    ->Args({256, 1})
    ->Args({256, 0})
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  tpudist::bench::StripFlags(&argc, argv, [](const std::string& a) {
    if (a == "--smoke") {
      g_smoke = true;
    } else if (const char* v = tpudist::bench::FlagValue(a, "--threads=")) {
      at::set_num_threads(std::atoi(v));
    } else {
      return false;
    }
    return true;
  });
  std::string min_time = "--benchmark_min_time=0.01";
  std::vector<char*> args(argv, argv + argc);
  if (g_smoke) args.push_back(min_time.data());
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  const double load_before = LoadAverage();
  benchmark::RunSpecifiedBenchmarks();
  const double load_after = LoadAverage();
  const g::GemmaConfig c = BenchConfig();
  std::printf("\n== gemma_bench: hidden %lld, %lld layers, vocab %lld, batch 2, %d thread(s); "
              "load average %.2f -> %.2f ==\n",
              static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_hidden_layers),
              static_cast<long long>(c.vocab_size), at::get_num_threads(), load_before, load_after);
  for (const auto& [label, r] : g_results) {
    const bool bf16 = label.rfind("bf16", 0) == 0;
    const Rate& same = bf16 ? r.gemm_bf16 : r.gemm_fp32;
    std::printf("%-20s step %8.1f ms | model %6.1f GFLOP/s (%6.1f per CPU s) | GEMM bf16 %6.1f "
                "(%6.1f), fp32 %6.1f (%6.1f) | MFU vs %s GEMM (same dtype) wall %5.1f%%, CPU time "
                "%5.1f%% | vs bf16 GEMM wall %5.1f%%, CPU time %5.1f%%%s\n",
                label.c_str(), r.step_s * 1e3, r.model.wall / 1e9, r.model.cpu / 1e9,
                r.gemm_bf16.wall / 1e9, r.gemm_bf16.cpu / 1e9, r.gemm_fp32.wall / 1e9,
                r.gemm_fp32.cpu / 1e9, bf16 ? "bf16" : "fp32", 100 * r.model.wall / same.wall,
                100 * r.model.cpu / same.cpu, 100 * r.model.wall / r.gemm_bf16.wall,
                100 * r.model.cpu / r.gemm_bf16.cpu, bf16 ? " (goal >= 30%)" : "");
  }
  benchmark::Shutdown();
  return 0;
}
