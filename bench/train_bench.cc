// train_bench: one training step of the tiny Gemma (GemmaTinyConfig, the
// data/tiny_gemma architecture) on forked ranks, FullyShard (FSDP2-style,
// the fine-tune's plan, below) against a replicated DDP-like step, with
// forward+backward MFU against a bf16 GEMM measured in the same run.
//
//   DDP-like  every rank holds the whole model; after backward the trainable
//             grads are flattened into one bucket, all_reduce(AVG)ed and
//             copied back; AdamW on the full parameters. With
//             --fsdp_dtype=bf16 it computes in bf16 too (mixed-precision
//             DDP: a bf16 copy of the model runs forward/backward, its grads
//             are reduced in fp32 into fp32 master weights, AdamW steps the
//             masters, which are cast back into the bf16 copy), so FSDP/DDP
//             measures FSDP's overhead at the same compute dtype.
//   FSDP      FullyShard per layer MLP, then the root with the PLE table
//             frozen and ignored (the plan of models/gemma's
//             ParallelizeGemma: the same modules, frozen and ignored
//             parameters and casts, applied here with FullyShard directly,
//             as in every earlier run of this bench), AdamW on the shards. --fsdp_dtype picks
//             param_dtype (fp32: same math as DDP-like; bf16: mixed
//             precision with fp32 reduce; PLE table and buffers cast to bf16).
// Both freeze the PLE table, use the same per-rank data and the same init, so
// step 0's loss must agree (printed as a sanity check).
//
// Each case (Google Benchmark, fixed iterations so ranks line up): barrier,
// --warmup steps, barrier, timed steps. --rounds=R registers the pair
// (DDP-like, FSDP) R times, interleaved, and reports each round's ratio and
// their range, after --warmup_rounds (default 1) unreported pairs.
// --fsdp_timers adds FullyShard's per-phase wall / CPU time (FsdpStats).
// The load average is printed before and after. Rank 0 reports step time, global
// tokens/s (world * batch * seq / step), per-rank model FLOP/s
// (bench_math.h DecoderStepFlops) and MFU = model FLOP/s / bf16 GEMM FLOP/s,
// the GEMM ([n, n] x [n, n], --gemm_n) timed on every rank at once, as the
// ranks share the cores during the steps too.
//
//   train_bench                       # world 2, batch 4, seq 128
//   train_bench --world=4 --backend=gloo --json_out=train.json
//   train_bench --world=4 --fsdp_dtype=bf16 --rounds=3
//   train_bench --world=4 --fsdp_dtype=bf16 --fsdp_timers   # where FSDP's time goes
//   train_bench --adamw=loop          # libtorch's per-tensor AdamW
//   train_bench --quick               # seconds (ctest smoke)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <c10/util/strides.h>
#include <torch/optim/adamw.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/bench_math.h"
#include "bench/proc_stats.h"
#include "bench/train_bench_flags.h"
#include "distributed/job.h"
#include "fsdp/device_mesh.h"
#include "fsdp/job_mesh.h"
#include "fsdp/fully_shard/fully_shard.h"
#include "models/gemma/gemma_config.h"
#include "models/gemma/gemma_decoder_layer.h"
#include "models/gemma/gemma_model.h"
#include "nlohmann/json.hpp"
#include "nn/fused_adamw.h"
#include "nn/malloc_tuning.h"
#include "testing/forked_ranks.h"
#include "testing/temp_dir.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"

namespace {

using tpudist::bench::LoadAverage;
using tpudist::bench::ProcessCpuSeconds;

namespace g = tpudist::models::gemma;
namespace tb = tpudist::bench;
using Clock = std::chrono::steady_clock;

using Flags = tb::TrainBenchFlags;

// Everything one rank needs; owned by main, captured by the benchmarks.
struct Env {
  Flags flags;
  int rank = 0;
  std::unique_ptr<tpudist::distributed::Job> job;  // owns the mesh's groups
  std::unique_ptr<tpudist::fsdp::DeviceMesh> mesh;
  at::Tensor ids;  // [batch, seq] int64, this rank's data
  double step_flops = 0;    // per rank, fwd+bwd
  double gemm_bf16 = 0;     // FLOP/s, this rank, all ranks running
  double gemm_fp32 = 0;
  std::map<std::string, double> seconds;  // per step, by case
  std::map<std::string, double> cpu_seconds;  // this process's CPU time per step (all threads)
  std::map<std::string, double> loss0;    // step-0 loss, by case
  std::map<std::string, std::string> phases;  // FSDP phase times per step, by case (--fsdp_timers)
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

// One replicated step: forward, backward, one flat all_reduce(AVG) in fp32,
// AdamW. `compute` runs forward/backward; compute_params[i] is its trainable
// parameter i and master[i] the one AdamW steps (the same tensor in fp32;
// with a bf16 compute model the fp32 master, copied back after the step).
double DdpStep(Env& env, g::GemmaForCausalLM& compute, torch::optim::AdamW& opt,
               const std::vector<at::Tensor>& compute_params, const std::vector<at::Tensor>& master) {
  opt.zero_grad();
  compute->zero_grad();
  at::Tensor loss = compute->forward(env.ids, {}, env.ids).loss;
  loss.backward();
  std::vector<at::Tensor> flat_grads;
  for (const at::Tensor& p : compute_params) {
    // Weights the graph does not reach (e.g. k/v of KV-shared layers) get
    // zero grads, so every rank's bucket has the same layout.
    flat_grads.push_back(p.grad().defined() ? p.grad().view(-1) : at::zeros({p.numel()}, p.options()));
  }
  std::vector<at::Tensor> bucket = {at::cat(flat_grads).to(at::kFloat)};  // [sum numel] fp32
  c10d::AllreduceOptions avg;
  avg.reduceOp = c10d::ReduceOp::AVG;
  avg.asyncOp = false;  // DDP-like: one bucket, waited on at once
  if (env.flags.backend == "gloo") {  // Gloo lacks AVG: SUM then scale
    avg.reduceOp = c10d::ReduceOp::SUM;
    env.mesh->Group(0)->allreduce(bucket, avg)->wait();
    bucket[0].div_(env.flags.world);
  } else {
    env.mesh->Group(0)->allreduce(bucket, avg)->wait();
  }
  int64_t off = 0;
  for (const at::Tensor& p : master) {  // grads alias the bucket (not views: zero_grad detach_()es)
    const int64_t n = p.numel();
    at::NoGradGuard no_grad;
    p.mutable_grad() = at::empty({0}, bucket[0].options())
                           .set_(bucket[0].storage(), off, p.sizes(), c10::contiguous_strides(p.sizes()));
    off += n;
  }
  opt.step();
  if (compute_params[0].unsafeGetTensorImpl() != master[0].unsafeGetTensorImpl()) {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < master.size(); ++i) compute_params[i].copy_(master[i]);
  }
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

// --adamw=fused: one fused ATen kernel call per step (nn/fused_adamw.h);
// loop: libtorch's per-tensor AdamW. Same options, same state.
std::unique_ptr<torch::optim::AdamW> MakeAdamW(const Env& env, std::vector<at::Tensor> params) {
  const auto opts = torch::optim::AdamWOptions(1e-3).weight_decay(0.01);
  if (env.flags.adamw == "loop") return std::make_unique<torch::optim::AdamW>(std::move(params), opts);
  return std::make_unique<tpudist::nn::FusedAdamW>(std::move(params), opts);
}

std::string CaseName(const Env& env, const std::string& kind, int round) {
  const bool warmup = round <= env.flags.warmup_rounds;
  return absl::StrCat("train_step/", kind, "/", env.flags.backend, "/world", env.flags.world,
                      warmup ? "/w" : "/r", warmup ? round : round - env.flags.warmup_rounds);
}

void RegisterStep(Env& env, const std::string& kind, int round) {
  const std::string name = CaseName(env, kind, round);
  auto* bm = benchmark::RegisterBenchmark(name.c_str(), [&env, name, kind](benchmark::State& state) {
    const bool bf16 = env.flags.fsdp_dtype == "bf16";
    g::GemmaForCausalLM model = MakeModel();
    PleWeight(*model).requires_grad_(false);
    g::GemmaForCausalLM master_model{nullptr};  // DDP-like bf16: the fp32 masters
    std::vector<at::Tensor> trainable, master;
    std::unique_ptr<torch::optim::AdamW> opt;
    if (kind == "ddp") {
      for (const at::Tensor& p : model->parameters()) {
        if (p.requires_grad()) trainable.push_back(p);
      }
      master = trainable;
      if (bf16) {
        master_model = MakeModel();  // same init as `model`
        PleWeight(*master_model).requires_grad_(false);
        master.clear();
        for (const at::Tensor& p : master_model->parameters()) {
          if (p.requires_grad()) master.push_back(p);
        }
        model->to(at::kBFloat16);  // params, PLE table and buffers, as FSDP's
      }
      opt = MakeAdamW(env, master);
    } else {
      const absl::Status sharded =
          ShardGemma(model, *env.mesh, bf16 ? std::optional(at::kBFloat16) : std::nullopt);
      if (!sharded.ok()) {
        state.SkipWithError(sharded.ToString().c_str());
        return;
      }
      opt = MakeAdamW(env, model->parameters());
    }
    auto step = [&] {
      return kind == "ddp" ? DdpStep(env, model, *opt, trainable, master) : FsdpStep(env, model, *opt);
    };
    Barrier(env);
    env.loss0[name] = step();
    for (int i = 1; i < env.flags.warmup; ++i) step();
    std::optional<tpudist::fsdp::FsdpModule> root;
    if (kind == "fsdp" && env.flags.fsdp_timers) {
      root = tpudist::fsdp::GetFsdpModule(*model);
      root->stats().timing = true;
      root->stats().phase_times.clear();
    }
    Barrier(env);
    const auto start = Clock::now();
    const double cpu_start = ProcessCpuSeconds();
    for (auto _ : state) step();
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    const double per_step = secs / std::max<int64_t>(state.iterations(), 1);
    if (root.has_value()) {  // ms per step: wall / this thread's CPU
      std::string line;
      double wall = 0, cpu = 0;
      const double n = static_cast<double>(std::max<int64_t>(state.iterations(), 1));
      for (const auto& [phase, t] : root->stats().phase_times) {
        absl::StrAppend(&line, " ", phase, " ", absl::SixDigits(1e3 * t.wall_s / n), "/",
                        absl::SixDigits(1e3 * t.cpu_s / n));
        wall += t.wall_s;
        cpu += t.cpu_s;
      }
      env.phases[name] = absl::StrCat("total ", absl::SixDigits(1e3 * wall / n), "/",
                                      absl::SixDigits(1e3 * cpu / n), " |", line);
      root->stats().timing = false;
    }
    env.seconds[name] = per_step;
    env.cpu_seconds[name] = (ProcessCpuSeconds() - cpu_start) / std::max<int64_t>(state.iterations(), 1);
    const double tokens = static_cast<double>(env.flags.world * env.flags.batch * env.flags.seq);
    state.counters["tokens/s"] = tokens / per_step;
    state.counters["MFU"] = env.step_flops / per_step / env.gemm_bf16;
  });
  bm->Iterations(env.flags.steps)->UseRealTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  Env env;
  env.flags = tb::ParseTrainBenchFlags(&argc, argv);
  benchmark::Initialize(&argc, argv);
  // Both sides (FSDP, DDP-like) run in the same forked ranks, so with the same
  // allocator settings (nn/malloc_tuning.h).
  const std::string malloc_note = tpudist::nn::TuneMallocForTraining();
  // The FileStore's directory, removed when this (the parent) process
  // returns from main; the forked ranks' copies leave it alone.
  const tpudist::test_support::ScopedTempDir run_dir("tpud_train_bench");
  if (run_dir.path().empty()) {
    std::perror("mkdtemp");
    return 2;
  }
  const std::string dir = run_dir.path();
  const std::string job = "trainb" + std::to_string(getpid());
  const tpudist::test_support::ForkedRanks ranks = tpudist::test_support::ForkRanks(env.flags.world);  // before any at:: op
  env.rank = ranks.rank;
  at::set_num_threads(1);
  // A job over the ranks' FileStore, without coordination (forked ranks of
  // one host; the job id names this run's shm segments); groups by the one
  // rule of distributed/group_config.h.
  tpudist::tpu_runtime::RankInfo info;
  info.rank = env.rank;
  info.world_size = env.flags.world;
  info.host_index = -1;  // one host: the process group finds it
  tpudist::distributed::JobOptions jo;
  jo.group.backend = env.flags.backend;
  jo.group.group_name = "train_bench";
  jo.group.timeout = absl::Seconds(120);
  jo.group.job_id = job;
  jo.group.gloo_threads = 1;
  jo.group.store = c10::make_intrusive<c10d::FileStore>(dir + "/store", env.flags.world);
  absl::StatusOr<std::unique_ptr<tpudist::distributed::Job>> started =
      tpudist::distributed::Job::Start(info, jo);
  if (!started.ok()) {
    std::fprintf(stderr, "train_bench: %s\n", started.status().ToString().c_str());
    _exit(2);
  }
  env.job = *std::move(started);
  absl::StatusOr<tpudist::fsdp::DeviceMesh> mesh =
      tpudist::fsdp::InitJobDeviceMesh(*env.job, {"cpu", {env.flags.world}, {"dp"}, "device_mesh"});
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
  // Rounds 1..warmup_rounds are the warm-up pairs (named w<r>, not reported).
  const int last = env.flags.warmup_rounds + env.flags.rounds;
  for (int r = 1; r <= last; ++r) {
    RegisterStep(env, "ddp", r);
    RegisterStep(env, "fsdp", r);
  }
  const double load_before = LoadAverage();
  benchmark::RunSpecifiedBenchmarks();
  Barrier(env);
  if (env.rank != 0) {
    env.mesh.reset();
    env.job.reset();  // the groups go with it
    _exit(0);
  }
  const double load_after = LoadAverage();
  const double tokens = static_cast<double>(env.flags.world * env.flags.batch * env.flags.seq);
  std::printf("\n== train step, tiny Gemma, %s, %d ranks, batch %lld x seq %lld per rank, "
              "FSDP param dtype %s, DDP-like compute dtype %s (fp32 reduce and masters), "
              "AdamW %s ==\n",
              env.flags.backend.c_str(), env.flags.world, static_cast<long long>(env.flags.batch),
              static_cast<long long>(env.flags.seq), env.flags.fsdp_dtype.c_str(),
              env.flags.fsdp_dtype.c_str(), env.flags.adamw.c_str());
  std::printf("load average %.2f -> %.2f; %d warm-up round(s) (a ddp, fsdp pair each) before the "
              "%d reported\n",
              load_before, load_after, env.flags.warmup_rounds, env.flags.rounds);
  std::printf("%s\n", malloc_note.c_str());
  std::printf("gemm %lld^3 per rank: bf16 %.2f GFLOP/s, fp32 %.2f GFLOP/s; model %.3f GFLOP "
              "per rank-step\n",
              static_cast<long long>(env.flags.gemm_n), env.gemm_bf16 / 1e9, env.gemm_fp32 / 1e9,
              env.step_flops / 1e9);
  nlohmann::json rows = nlohmann::json::array();
  std::vector<double> ratios;
  bool ok = true;
  const double tol = env.flags.fsdp_dtype == "bf16" ? 5e-2 : 1e-4;
  for (int k = 1; k <= env.flags.rounds; ++k) {
    const int r = env.flags.warmup_rounds + k;  // the case registered as round r
    const double ddp = env.seconds[CaseName(env, "ddp", r)];
    const double fsdp = env.seconds[CaseName(env, "fsdp", r)];
    for (const auto& [kind, s] : {std::pair<std::string, double>{"ddp", ddp}, {"fsdp", fsdp}}) {
      const double mfu = s > 0 ? env.step_flops / s / env.gemm_bf16 : 0;
      const double loss0 = env.loss0[CaseName(env, kind, r)];
      const double cpu = env.cpu_seconds[CaseName(env, kind, r)];
      std::printf("r%d %-5s step %9.2f ms (rank 0 CPU %7.2f ms) | %10.0f tokens/s | MFU vs bf16 "
                  "GEMM %5.1f%% | vs fp32 GEMM %5.1f%% | loss0 %.6f\n",
                  k, kind.c_str(), s * 1e3, cpu * 1e3, s > 0 ? tokens / s : 0, 100 * mfu,
                  s > 0 ? 100 * env.step_flops / s / env.gemm_fp32 : 0, loss0);
      rows.push_back({{"round", k}, {"kind", kind}, {"step_ms", s * 1e3}, {"cpu_ms", cpu * 1e3},
                      {"tokens_per_s", s > 0 ? tokens / s : 0}, {"mfu_vs_bf16_gemm", mfu},
                      {"loss0", loss0}});
    }
    ratios.push_back((ddp > 0 && fsdp > 0) ? ddp / fsdp : 0);
    if (const auto it = env.phases.find(CaseName(env, "fsdp", r)); it != env.phases.end()) {
      std::printf("r%d fsdp phases, rank 0, ms per step wall/CPU: %s\n", k, it->second.c_str());
    }
    std::printf("r%d fsdp/ddp tokens/s %.3f (goal >= 0.9)\n", k, ratios.back());
    ok = ok && ddp > 0 && fsdp > 0;
    // Must run, not meet a number: fail when a step was not measured, or
    // when step 0 (before any update, same weights and data) disagrees
    // between the replicated and the sharded model beyond rounding.
    const double l_ddp = env.loss0[CaseName(env, "ddp", r)];
    const double l_fsdp = env.loss0[CaseName(env, "fsdp", r)];
    if (!(std::abs(l_ddp - l_fsdp) <= tol * std::max(1.0, std::abs(l_ddp)))) {
      std::fprintf(stderr, "train_bench: step-0 loss ddp %.6f vs fsdp %.6f (tol %g)\n", l_ddp,
                   l_fsdp, tol);
      ok = false;
    }
  }
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  std::printf("fsdp/ddp tokens/s over %d round(s): %.3f .. %.3f\n", env.flags.rounds, *lo, *hi);
  if (!env.flags.json_out.empty()) {
    nlohmann::json j = {{"bench", "train"}, {"backend", env.flags.backend},
                        {"world", env.flags.world}, {"batch", env.flags.batch},
                        {"seq", env.flags.seq}, {"fsdp_dtype", env.flags.fsdp_dtype},
                        {"load_before", load_before}, {"load_after", load_after},
                        {"gemm_bf16_GFLOPs", env.gemm_bf16 / 1e9},
                        {"gemm_fp32_GFLOPs", env.gemm_fp32 / 1e9},
                        {"step_GFLOP", env.step_flops / 1e9}, {"rows", rows},
                        {"fsdp_over_ddp_tokens", ratios.front()},  // round 1 (tools/bench.sh)
                        {"fsdp_over_ddp_tokens_rounds", ratios}};
    std::ofstream(env.flags.json_out) << j.dump(1) << "\n";
  }
  benchmark::Shutdown();
  const absl::Status waited = tpudist::test_support::WaitForRanks(ranks, absl::Seconds(60));
  if (!waited.ok()) std::fprintf(stderr, "%s\n", waited.ToString().c_str());
  env.mesh.reset();
  env.job.reset();  // the groups go with it; run_dir (the FileStore's directory) goes when main returns
  ok = ok && waited.ok();
  return ok ? 0 : 1;
}
