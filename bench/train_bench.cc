// train_bench: one training step of the tiny Gemma (GemmaTinyConfig, the
// data/tiny_gemma architecture) on forked ranks, FullyShard (FSDP2-style,
// the fine-tune's plan, below) against a replicated DDP-like step, with
// forward+backward MFU against a bf16 GEMM measured in the same run.
//
//   DDP-like  every rank holds the whole model; after backward the trainable
//             grads are flattened into one bucket, all_reduce(AVG)ed and
//             copied back; AdamW on the full parameters.
//   FSDP      FullyShard per layer MLP, then the root with the PLE table
//             frozen and ignored (the plan of models/gemma's
//             ParallelizeGemma, applied here with FullyShard directly until
//             that lands in git), AdamW on the shards. --fsdp_dtype picks
//             param_dtype (fp32: same math as DDP-like; bf16: mixed
//             precision with fp32 reduce; PLE table and buffers cast to bf16).
// Both freeze the PLE table, use the same per-rank data and the same init, so
// step 0's loss must agree (printed as a sanity check).
//
// Each case (Google Benchmark, fixed iterations so ranks line up): barrier,
// --warmup steps, barrier, timed steps. Rank 0 reports step time, global
// tokens/s (world * batch * seq / step), per-rank model FLOP/s
// (bench_math.h DecoderStepFlops) and MFU = model FLOP/s / bf16 GEMM FLOP/s,
// the GEMM ([n, n] x [n, n], --gemm_n) timed on every rank at once, as the
// ranks share the cores during the steps too.
//
//   train_bench                       # world 2, batch 4, seq 128
//   train_bench --world=4 --backend=gloo --json_out=train.json
//   train_bench --quick               # seconds (ctest smoke)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/optim/adamw.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/bench_math.h"
#include "bench/forked_ranks.h"
#include "distributed/init_process_group.h"
#include "fsdp/device_mesh.h"
#include "models/gemma/gemma_config.h"
#include "models/gemma/gemma_model.h"
#include "fsdp/fully_shard/fully_shard.h"
#include "models/gemma/gemma_decoder_layer.h"
#include "nlohmann/json.hpp"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"

namespace {

namespace g = tpudist::models::gemma;
namespace tb = tpudist::bench;
using Clock = std::chrono::steady_clock;

struct Flags {
  int world = 2;
  int64_t batch = 4, seq = 128;  // per rank
  int warmup = 2, steps = 8;
  int64_t gemm_n = 1024;
  std::string backend = "tpu_dist";
  std::string fsdp_dtype = "fp32";  // FSDP param_dtype: fp32 | bf16
  bool quick = false;
  std::string json_out;
};

Flags ParseAndStrip(int* argc, char** argv) {
  Flags f;
  int out = 1;
  auto value = [](const std::string& a, const char* name) -> const char* {
    const size_t n = std::strlen(name);
    return a.compare(0, n, name) == 0 ? a.c_str() + n : nullptr;
  };
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    const char* v = nullptr;
    if ((v = value(a, "--world="))) f.world = std::stoi(v);
    else if ((v = value(a, "--batch="))) f.batch = std::stoll(v);
    else if ((v = value(a, "--seq="))) f.seq = std::stoll(v);
    else if ((v = value(a, "--warmup="))) f.warmup = std::stoi(v);
    else if ((v = value(a, "--steps="))) f.steps = std::stoi(v);
    else if ((v = value(a, "--gemm_n="))) f.gemm_n = std::stoll(v);
    else if ((v = value(a, "--backend="))) f.backend = v;
    else if ((v = value(a, "--fsdp_dtype="))) f.fsdp_dtype = v;
    else if ((v = value(a, "--json_out="))) f.json_out = v;
    else if (a == "--quick" || a == "--smoke") f.quick = true;
    else argv[out++] = argv[i];
  }
  *argc = out;
  if (f.quick) {
    f.batch = 2;
    f.seq = 32;
    f.warmup = 1;
    f.steps = 2;
    f.gemm_n = 256;
  }
  return f;
}

// Groups by the one rule of distributed/group_config.h (forked ranks of one
// host: no RankInfo; the job id names this run's shm segments).
tpudist::fsdp::GroupFactory MakeFactory(const std::string& backend, const std::string& job) {
  tpudist::distributed::GroupInitOptions o;
  o.backend = backend;
  o.group_name = "train_bench";
  o.timeout = absl::Seconds(120);
  o.job_id = job;
  o.gloo_threads = 1;
  absl::StatusOr<tpudist::distributed::GroupConfig> config =
      tpudist::distributed::ResolveGroupConfigFromProcess(nullptr, o);
  if (!config.ok()) {
    std::fprintf(stderr, "train_bench: %s\n", config.status().ToString().c_str());
    _exit(2);
  }
  return tpudist::distributed::MakeGroupFactory(*config);
}

// Everything one rank needs; owned by main, captured by the benchmarks.
struct Env {
  Flags flags;
  int rank = 0;
  std::unique_ptr<tpudist::fsdp::DeviceMesh> mesh;
  at::Tensor ids;  // [batch, seq] int64, this rank's data
  double step_flops = 0;    // per rank, fwd+bwd
  double gemm_bf16 = 0;     // FLOP/s, this rank, all ranks running
  double gemm_fp32 = 0;
  std::map<std::string, double> seconds;  // per step, by case
  std::map<std::string, double> loss0;    // step-0 loss, by case
};

void Barrier(Env& env) { env.mesh->Group(0)->barrier()->wait(); }

g::GemmaForCausalLM MakeModel() {
  g::GemmaForCausalLM model(g::GemmaTinyConfig());
  g::InitGemmaWeights(*model, {.seed = 7});
  return model;
}

// Matmul weights (2-D, embedding lookups excluded) + the tied lm_head.
double MatmulParams(g::GemmaForCausalLMImpl& model) {
  double n = 0;
  for (const auto& p : model.named_parameters(true)) {
    if (p.value().dim() != 2 || p.key().find("embed_tokens") != std::string::npos) continue;
    n += static_cast<double>(p.value().numel());
  }
  const g::GemmaConfig& c = model.config();
  return n + static_cast<double>(c.vocab_size) * c.hidden_size;
}

double GemmFlops(int64_t n, at::ScalarType dtype, int iters) {
  at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  at::matmul(a, b);
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) benchmark::DoNotOptimize(at::matmul(a, b).data_ptr());
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return 2.0 * n * n * n * iters / s;
}

// One replicated step: forward, backward, one flat all_reduce(AVG), AdamW.
double DdpStep(Env& env, g::GemmaForCausalLM& model, torch::optim::AdamW& opt,
               const std::vector<at::Tensor>& trainable) {
  opt.zero_grad();
  at::Tensor loss = model->forward(env.ids, {}, env.ids).loss;
  loss.backward();
  std::vector<at::Tensor> flat_grads;
  for (const at::Tensor& p : trainable) {
    // Weights the graph does not reach (e.g. k/v of KV-shared layers) get
    // zero grads, so every rank's bucket has the same layout.
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    flat_grads.push_back(p.grad().view(-1));
  }
  std::vector<at::Tensor> bucket = {at::cat(flat_grads)};  // [sum numel]
  c10d::AllreduceOptions avg;
  avg.reduceOp = c10d::ReduceOp::AVG;
  if (env.flags.backend == "gloo") {  // Gloo lacks AVG: SUM then scale
    avg.reduceOp = c10d::ReduceOp::SUM;
    env.mesh->Group(0)->allreduce(bucket, avg)->wait();
    bucket[0].div_(env.flags.world);
  } else {
    env.mesh->Group(0)->allreduce(bucket, avg)->wait();
  }
  int64_t off = 0;
  for (const at::Tensor& p : trainable) {
    const int64_t n = p.numel();
    p.mutable_grad().view(-1).copy_(bucket[0].narrow(0, off, n));
    off += n;
  }
  opt.step();
  return loss.item<double>();
}

at::Tensor PleWeight(g::GemmaForCausalLMImpl& model) {  // [Vp, L * P]
  return model.model->embed_tokens_per_layer->weight;
}

// The fine-tune's FSDP plan: every MLP, then the root (PLE ignored).
absl::Status ShardGemma(g::GemmaForCausalLM& model, const tpudist::fsdp::DeviceMesh& mesh,
                        std::optional<at::ScalarType> param_dtype) {
  tpudist::fsdp::FullyShardOptions opts;
  opts.mp_policy.param_dtype = param_dtype;
  opts.mp_policy.reduce_dtype = at::kFloat;
  for (const auto& layer : *model->model->layers) {
    auto& mlp = layer->as<g::GemmaDecoderLayerImpl>()->mlp;
    absl::StatusOr<tpudist::fsdp::FsdpModule> m = tpudist::fsdp::FullyShard(mlp.ptr(), mesh, opts);
    if (!m.ok()) return m.status();
  }
  if (param_dtype.has_value()) {  // what the gathered weights meet in forward
    at::NoGradGuard no_grad;
    PleWeight(*model).set_data(PleWeight(*model).to(*param_dtype));
    for (auto& b : model->named_buffers()) b.value().set_data(b.value().to(*param_dtype));
  }
  opts.ignored_params = {PleWeight(*model)};
  return tpudist::fsdp::FullyShard(model.ptr(), mesh, opts).status();
}

double FsdpStep(Env& env, g::GemmaForCausalLM& model, torch::optim::AdamW& opt) {
  opt.zero_grad();
  at::Tensor loss = model->forward(env.ids, {}, env.ids).loss;
  loss.backward();
  opt.step();
  return loss.item<double>();
}

torch::optim::AdamWOptions Adam() { return torch::optim::AdamWOptions(1e-3).weight_decay(0.01); }

void RegisterStep(Env& env, const std::string& kind) {
  const std::string name = absl::StrCat("train_step/", kind, "/", env.flags.backend, "/world",
                                        env.flags.world);
  auto* bm = benchmark::RegisterBenchmark(name.c_str(), [&env, name, kind](benchmark::State& state) {
    g::GemmaForCausalLM model = MakeModel();
    PleWeight(*model).requires_grad_(false);
    std::vector<at::Tensor> trainable;
    std::unique_ptr<torch::optim::AdamW> opt;
    if (kind == "ddp") {
      for (const at::Tensor& p : model->parameters()) {
        if (p.requires_grad()) trainable.push_back(p);
      }
      opt = std::make_unique<torch::optim::AdamW>(trainable, Adam());
    } else {
      const absl::Status sharded = ShardGemma(
          model, *env.mesh,
          env.flags.fsdp_dtype == "bf16" ? std::optional(at::kBFloat16) : std::nullopt);
      if (!sharded.ok()) {
        state.SkipWithError(sharded.ToString().c_str());
        return;
      }
      opt = std::make_unique<torch::optim::AdamW>(model->parameters(), Adam());
    }
    auto step = [&] {
      return kind == "ddp" ? DdpStep(env, model, *opt, trainable) : FsdpStep(env, model, *opt);
    };
    Barrier(env);
    env.loss0[name] = step();
    for (int i = 1; i < env.flags.warmup; ++i) step();
    Barrier(env);
    const auto start = Clock::now();
    for (auto _ : state) step();
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    const double per_step = secs / std::max<int64_t>(state.iterations(), 1);
    env.seconds[name] = per_step;
    const double tokens = static_cast<double>(env.flags.world * env.flags.batch * env.flags.seq);
    state.counters["tokens/s"] = tokens / per_step;
    state.counters["MFU"] = env.step_flops / per_step / env.gemm_bf16;
  });
  bm->Iterations(env.flags.steps)->UseRealTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  Env env;
  env.flags = ParseAndStrip(&argc, argv);
  benchmark::Initialize(&argc, argv);
  char dir_template[] = "/tmp/tpud_train_bench_XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string job = "trainb" + std::to_string(getpid());
  const tb::ForkedRanks ranks = tb::ForkRanks(env.flags.world);  // before any at:: op
  env.rank = ranks.rank;
  at::set_num_threads(1);
  tpudist::fsdp::DeviceMeshEnv menv;
  menv.rank = env.rank;
  menv.world_size = env.flags.world;
  menv.store = c10::make_intrusive<c10d::FileStore>(dir + "/store", env.flags.world);
  menv.group_factory = MakeFactory(env.flags.backend, job);
  menv.collective_timeout = absl::Seconds(120);
  absl::StatusOr<tpudist::fsdp::DeviceMesh> mesh =
      tpudist::fsdp::InitDeviceMesh("cpu", {env.flags.world}, {"dp"}, menv);
  if (!mesh.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", env.rank, mesh.status().ToString().c_str());
    _exit(1);
  }
  env.mesh = std::make_unique<tpudist::fsdp::DeviceMesh>(*mesh);
  at::Generator gen = at::detail::createCPUGenerator(1000 + env.rank);
  env.ids = at::randint(3, g::GemmaTinyConfig().vocab_size, {env.flags.batch, env.flags.seq}, gen,
                        at::kLong);
  {
    g::GemmaForCausalLM model = MakeModel();
    const g::GemmaConfig& c = model->config();
    std::vector<int64_t> head_dims;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) head_dims.push_back(c.HeadDim(i));
    env.step_flops = tb::DecoderStepFlops(MatmulParams(*model), env.flags.batch, env.flags.seq,
                                          c.num_attention_heads, head_dims);
  }
  Barrier(env);
  const int gemm_iters = env.flags.quick ? 2 : 10;
  env.gemm_bf16 = GemmFlops(env.flags.gemm_n, at::kBFloat16, gemm_iters);
  env.gemm_fp32 = GemmFlops(env.flags.gemm_n, at::kFloat, gemm_iters);
  RegisterStep(env, "ddp");
  RegisterStep(env, "fsdp");
  benchmark::RunSpecifiedBenchmarks();
  Barrier(env);
  if (env.rank != 0) {
    env.mesh.reset();
    _exit(0);
  }
  const std::string suffix = absl::StrCat("/", env.flags.backend, "/world", env.flags.world);
  const double ddp = env.seconds["train_step/ddp" + suffix];
  const double fsdp = env.seconds["train_step/fsdp" + suffix];
  const double tokens = static_cast<double>(env.flags.world * env.flags.batch * env.flags.seq);
  std::printf("\n== train step, tiny Gemma, %s, %d ranks, batch %lld x seq %lld per rank, "
              "FSDP param dtype %s ==\n",
              env.flags.backend.c_str(), env.flags.world, static_cast<long long>(env.flags.batch),
              static_cast<long long>(env.flags.seq), env.flags.fsdp_dtype.c_str());
  std::printf("gemm %lld^3 per rank: bf16 %.2f GFLOP/s, fp32 %.2f GFLOP/s; model %.3f GFLOP "
              "per rank-step\n",
              static_cast<long long>(env.flags.gemm_n), env.gemm_bf16 / 1e9, env.gemm_fp32 / 1e9,
              env.step_flops / 1e9);
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [kind, s] : {std::pair<std::string, double>{"ddp", ddp}, {"fsdp", fsdp}}) {
    const double mfu = s > 0 ? env.step_flops / s / env.gemm_bf16 : 0;
    const double loss0 = env.loss0["train_step/" + kind + suffix];
    std::printf("%-5s step %9.2f ms | %10.0f tokens/s | MFU vs bf16 GEMM %5.1f%% | "
                "vs fp32 GEMM %5.1f%% | loss0 %.6f\n",
                kind.c_str(), s * 1e3, s > 0 ? tokens / s : 0, 100 * mfu,
                s > 0 ? 100 * env.step_flops / s / env.gemm_fp32 : 0, loss0);
    rows.push_back({{"kind", kind}, {"step_ms", s * 1e3}, {"tokens_per_s", s > 0 ? tokens / s : 0},
                    {"mfu_vs_bf16_gemm", mfu}, {"loss0", loss0}});
  }
  const double ratio = (ddp > 0 && fsdp > 0) ? ddp / fsdp : 0;
  std::printf("fsdp/ddp tokens/s %.3f (goal >= 0.85)\n", ratio);
  if (!env.flags.json_out.empty()) {
    nlohmann::json j = {{"bench", "train"}, {"backend", env.flags.backend},
                        {"world", env.flags.world}, {"batch", env.flags.batch},
                        {"seq", env.flags.seq}, {"fsdp_dtype", env.flags.fsdp_dtype},
                        {"gemm_bf16_GFLOPs", env.gemm_bf16 / 1e9},
                        {"gemm_fp32_GFLOPs", env.gemm_fp32 / 1e9},
                        {"step_GFLOP", env.step_flops / 1e9}, {"rows", rows},
                        {"fsdp_over_ddp_tokens", ratio}};
    std::ofstream(env.flags.json_out) << j.dump(1) << "\n";
  }
  benchmark::Shutdown();
  const absl::Status waited = tb::WaitForRanks(ranks, absl::Seconds(60));
  if (!waited.ok()) std::fprintf(stderr, "%s\n", waited.ToString().c_str());
  env.mesh.reset();
  // Must run, not meet a number: fail when a step was not measured, or when
  // step 0 (before any update, same weights and data) disagrees between the
  // replicated and the sharded model beyond rounding.
  const double l_ddp = env.loss0["train_step/ddp" + suffix];
  const double l_fsdp = env.loss0["train_step/fsdp" + suffix];
  const double tol = env.flags.fsdp_dtype == "bf16" ? 5e-2 : 1e-4;
  bool ok = waited.ok() && ddp > 0 && fsdp > 0;
  if (!(std::abs(l_ddp - l_fsdp) <= tol * std::max(1.0, std::abs(l_ddp)))) {
    std::fprintf(stderr, "train_bench: step-0 loss ddp %.6f vs fsdp %.6f (tol %g)\n", l_ddp,
                 l_fsdp, tol);
    ok = false;
  }
  return ok ? 0 : 1;
}
