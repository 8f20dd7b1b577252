// gemma_bench: forward+backward throughput of the Gemma 4 text decoder on CPU
// and its model-FLOPs utilisation (MFU) against a bf16 GEMM measured in the
// same run.
//
//   gemma_bench                 # full run
//   gemma_bench --smoke         # a couple of iterations (ctest)
//
// MFU = achieved model FLOP/s / bf16 GEMM FLOP/s, where model FLOPs per step
// are 6 * (matmul parameters, incl. the tied lm_head) * tokens plus the
// attention matmuls 12 * layers * B * H * S^2 * D (fwd 4, bwd 8), and the GEMM
// rate is measured with at::matmul on [1024, 1024] x [1024, 1024] bf16 in
// the same process (BM_Bf16Gemm, and again inside each model benchmark so
// the counter is self-contained).
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "models/gemma/gemma_config.h"
#include "models/gemma/gemma_model.h"

namespace {

namespace g = tpudist::models::gemma;

bool g_smoke = false;  // set once in main from --smoke, read-only afterwards

// A bench-sized config of the same architecture as the tiny one.
g::GemmaConfig BenchConfig() {
  g::GemmaConfig c = g::GemmaTinyConfig();
  c.hidden_size = 256;
  c.intermediate_size = 1024;
  c.num_attention_heads = 4;
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

double MeasureGemmaFlops(int iters) {
  at::Tensor a = at::randn({1024, 1024}).to(at::kBFloat16);
  at::Tensor w = at::randn({1024, 1024}).to(at::kBFloat16);
  at::matmul(a, w);  // warm up
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) at::matmul(a, w);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 2.0 * 1024 * 1024 * 1024 * iters / sec;
}

void BM_Bf16Gemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  at::Tensor a = at::randn({n, n}).to(at::kBFloat16);
  at::Tensor w = at::randn({n, n}).to(at::kBFloat16);
  for (auto _ : state) benchmark::DoNotOptimize(at::matmul(a, w).data_ptr());
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}

// range(0): seq len, range(1): 1 for bf16 else fp32.
void BM_GemmaFwdBwd(benchmark::State& state) {
  const int64_t b = 2, s = state.range(0);
  const bool bf16 = state.range(1) == 1;
  g::GemmaForCausalLM model(BenchConfig());
  g::InitGemmaWeights(*model, {0, 0.02, 1.0});
  if (bf16) model->to(at::kBFloat16);
  at::Tensor ids = at::randint(3, BenchConfig().vocab_size, {b, s}, at::kLong);
  for (auto _ : state) {
    g::CausalLMOutput out = model->forward(ids, at::Tensor(), ids);
    out.loss.backward();
    model->zero_grad();
  }
  const double flops = StepFlops(*model, b, s);
  const double gemm = MeasureGemmaFlops(g_smoke ? 2 : 20);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(b * s), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["model_FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["gemm_bf16_FLOP/s"] = gemm;
  // (flops / gemm) per iteration as a rate = model FLOP/s / GEMM FLOP/s.
  state.counters["MFU"] = benchmark::Counter(flops / gemm, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_Bf16Gemm)->Arg(1024)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmaFwdBwd)->Args({128, 1})->Args({256, 1})->Args({256, 0})->UseRealTime()->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--smoke") == 0) {
      g_smoke = true;
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  std::string min_time = "--benchmark_min_time=0.01";
  std::vector<char*> args(argv, argv + argc);
  if (g_smoke) args.push_back(min_time.data());
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
