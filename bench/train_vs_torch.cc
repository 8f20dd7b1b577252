// train_vs_torch: our side of bench/python/train_vs_torch.py (issue #16 goal
// 6). One training step of the tiny Gemma loaded from a Hugging Face
// directory (data/tiny_gemma), FullyShard-ed over the tpu_dist backend (or
// Gloo, --backend=gloo), AdamW; one forked process per rank, one intra-op
// thread each. The Python driver runs torch's FSDP2 over Gloo on
// transformers' Gemma4ForCausalLM with the same flags and compares.
//
// Per step: zero_grad, forward, shifted causal-LM cross-entropy (labels =
// the ids), backward, AdamW step. Data: one global batch [global_batch, seq]
// of ids drawn once by at::randint(3, vocab, gen(seed)) -- the same draw as
// torch.randint with torch.Generator().manual_seed(seed) in Python (same
// library) --; rank r trains rows [r * G / W, (r + 1) * G / W) every step.
// --warmup steps (step 0 among them), barrier, --steps timed steps; rank 0
// times each step. Loss of step 0 and of the last step: mean over ranks
// (SUM all_reduce / world, outside the timed steps).
//
// Plans (the same on both sides):
//   layers  FullyShard every decoder layer, then the root (torchtitan's)
//   mlp     models/gemma ParallelizeGemma (every MLP, then the root)
// --freeze_ple=1 freezes the PLE table and leaves it out of FSDP (the
// fine-tune's choice); default 0: every parameter trains.
//
//   train_vs_torch --model_dir=data/tiny_gemma --world=4 --json_out=ours.json
//
// Rank 0 prints one line and writes JSON (--json_out): world, backend, plan,
// step_ms_mean/min, tokens_per_s, loss0, loss_last, cpu_ms_per_step (process
// CPU time of the timed steps, every thread, summed over the ranks, per
// step: what the step costs the machine, less sensitive to other load than
// wall time), load_before/after.
// Exit 1 when a rank failed or a loss is not finite.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/train_vs_torch_flags.h"
#include "distributed/job.h"
#include "fsdp/device_mesh.h"
#include "fsdp/job_mesh.h"
#include "fsdp/fully_shard/fully_shard.h"
#include "models/gemma/gemma_model.h"
#include "models/gemma/hf_checkpoint.h"
#include "models/gemma/parallelize_gemma.h"
#include "nn/malloc_tuning.h"
#include "nlohmann/json.hpp"
#include "testing/forked_ranks.h"
#include "testing/temp_dir.h"
#include "torch/csrc/distributed/c10d/FileStore.hpp"

namespace {

namespace g = tpudist::models::gemma;
namespace tb = tpudist::bench;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(int rank, const std::string& what) {
  std::fprintf(stderr, "train_vs_torch rank %d: %s\n", rank, what.c_str());
  std::fflush(stderr);
  _exit(1);
}

// CPU time of this process, every thread (tpu_dist's helpers included).
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

std::string LoadAvg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

// A job over the forked ranks' FileStore at `store_path`, without
// coordination (one host; `job` names this run's shm segments); groups by the
// one rule of distributed/group_config.h.
std::unique_ptr<tpudist::distributed::Job> StartJob(const tb::TrainVsTorchFlags& f, const std::string& job,
                                                    const std::string& store_path, int rank) {
  tpudist::tpu_runtime::RankInfo info;
  info.rank = rank;
  info.world_size = f.world;
  info.host_index = -1;  // one host: the process group finds it
  tpudist::distributed::JobOptions o;
  o.group.backend = f.backend;
  o.group.group_name = "train_vs_torch";
  o.group.timeout = absl::Seconds(f.timeout_s);
  o.group.job_id = job;
  o.group.gloo_threads = 1;
  o.group.store = c10::make_intrusive<c10d::FileStore>(store_path, f.world);
  absl::StatusOr<std::unique_ptr<tpudist::distributed::Job>> started =
      tpudist::distributed::Job::Start(info, o);
  if (!started.ok()) Die(rank, started.status().ToString());
  return *std::move(started);
}

// FullyShard per the plan (see the top of the file), fp32 throughout.
absl::Status Shard(const tb::TrainVsTorchFlags& f, g::GemmaForCausalLM& model,
                   const tpudist::fsdp::DeviceMesh& mesh) {
  at::Tensor ple = g::PleWeight(*model);
  if (f.freeze_ple && ple.defined()) ple.requires_grad_(false);
  if (f.plan == "mlp") {
    g::GemmaParallelOptions o;
    o.param_dtype = std::nullopt;
    o.reduce_dtype = std::nullopt;
    o.freeze_ple = f.freeze_ple;
    return g::ParallelizeGemma(model, mesh, o).status();
  }
  tpudist::fsdp::FullyShardOptions o;
  for (const auto& layer : *model->model->layers) {
    absl::StatusOr<tpudist::fsdp::FsdpModule> m =
        tpudist::fsdp::FullyShard(layer, mesh, o);
    if (!m.ok()) return m.status();
  }
  if (f.freeze_ple && ple.defined()) o.ignored_params = {ple};
  return tpudist::fsdp::FullyShard(model.ptr(), mesh, o).status();
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<tb::TrainVsTorchFlags> parsed = tb::ParseTrainVsTorchFlags(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "train_vs_torch: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  const tb::TrainVsTorchFlags f = *parsed;
  // Our runtime's allocator settings (nn/malloc_tuning.h), before the ranks
  // fork; torch's side runs with glibc's defaults unless the environment
  // sets MALLOC_* (then both sides use those and this changes nothing).
  const std::string malloc_note = tpudist::nn::TuneMallocForTraining();
  const std::string load_before = LoadAvg();
  // The FileStore's directory, removed when this (the parent) process
  // returns from main; the forked ranks' copies leave it alone.
  const tpudist::test_support::ScopedTempDir run_dir("tpud_train_vs_torch");
  if (run_dir.path().empty()) {
    std::perror("mkdtemp");
    return 2;
  }
  const std::string dir = run_dir.path();
  const std::string job = "tvt" + std::to_string(getpid());
  const tpudist::test_support::ForkedRanks ranks = tpudist::test_support::ForkRanks(f.world);  // before any at:: op
  const int rank = ranks.rank;
  at::set_num_threads(1);

  const std::unique_ptr<tpudist::distributed::Job> dist_job = StartJob(f, job, dir + "/store", rank);
  absl::StatusOr<tpudist::fsdp::DeviceMesh> made =
      tpudist::fsdp::InitJobDeviceMesh(*dist_job, {"cpu", {f.world}, {"dp"}, "device_mesh"});
  if (!made.ok()) Die(rank, made.status().ToString());
  auto mesh = std::make_unique<tpudist::fsdp::DeviceMesh>(*std::move(made));
  c10d::ProcessGroup* group = mesh->Group(0).get();  // owned by mesh

  absl::StatusOr<g::GemmaForCausalLM> loaded =
      g::LoadGemmaFromHf(f.model_dir, {.dtype = at::kFloat, .log = [](const std::string&) {}});
  if (!loaded.ok()) Die(rank, loaded.status().ToString());
  g::GemmaForCausalLM model = *loaded;
  model->train();
  const int64_t vocab = model->config().vocab_size;
  if (absl::Status s = Shard(f, model, *mesh); !s.ok()) Die(rank, "FullyShard: " + s.ToString());
  std::vector<at::Tensor> trainable;
  for (const at::Tensor& p : model->parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  torch::optim::AdamW opt(trainable, torch::optim::AdamWOptions(f.lr)
                                         .betas({f.beta1, f.beta2})
                                         .eps(f.eps)
                                         .weight_decay(f.weight_decay));

  at::Generator gen = at::detail::createCPUGenerator(f.seed);
  const at::Tensor global_ids =
      at::randint(3, vocab, {f.global_batch, f.seq}, gen, at::kLong);  // [G, S]
  const int64_t per_rank = f.global_batch / f.world;
  const at::Tensor ids = global_ids.narrow(0, rank * per_rank, per_rank).contiguous();  // [B, S]

  auto step = [&]() -> at::Tensor {
    opt.zero_grad();
    at::Tensor loss = model->forward(ids, {}, ids).loss;  // [] fp32
    loss.backward();
    opt.step();
    return loss.detach();
  };
  at::Tensor loss0 = step();
  for (int i = 1; i < f.warmup; ++i) step();
  group->barrier()->wait();
  std::vector<double> ms;
  at::Tensor last = loss0;
  const auto start = Clock::now();
  const double cpu_start = ProcessCpuSeconds();
  for (int i = 0; i < f.steps; ++i) {
    const auto t0 = Clock::now();
    last = step();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  const double total_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  const double cpu_s = ProcessCpuSeconds() - cpu_start;
  // [3]: loss0, last loss, CPU seconds of the timed steps; summed over ranks.
  std::vector<at::Tensor> losses = {
      at::cat({at::stack({loss0, last}).to(at::kDouble), at::full({1}, cpu_s, at::kDouble)})
          .to(at::kFloat)};
  c10d::AllreduceOptions sum;
  sum.reduceOp = c10d::ReduceOp::SUM;
  sum.asyncOp = false;
  group->allreduce(losses, sum)->wait();
  const double cpu_ms_all_ranks = losses[0][2].item<double>() * 1e3 / f.steps;
  losses[0].narrow(0, 0, 2).div_(f.world);
  // Leaving: through the store, not a last barrier. Every rank reports that
  // it is out of the collectives; followers exit only when rank 0 has seen
  // all reports. (With a last barrier + exit, one 16-rank run at load ~14
  // aborted: a peer was reported "died" inside the barrier; whether it had
  // crashed or had already left the barrier is not established. See
  // bench/README.md, Goal 6.)
  const auto store_timeout = std::chrono::milliseconds(1000LL * f.timeout_s);
  if (rank != 0) {
    dist_job->store()->set("tvt_done/" + std::to_string(rank), std::string("1"));
    dist_job->store()->wait({"tvt_release"}, store_timeout);
    mesh.reset();
    dist_job->Shutdown();  // the groups go with it
    _exit(0);
  }
  std::vector<std::string> done;
  for (int r = 1; r < f.world; ++r) done.push_back("tvt_done/" + std::to_string(r));
  if (!done.empty()) dist_job->store()->wait(done, store_timeout);
  dist_job->store()->set("tvt_release", std::string("1"));
  const double mean_ms = total_ms / f.steps;
  const double min_ms = *std::min_element(ms.begin(), ms.end());
  const double tokens = static_cast<double>(f.global_batch * f.seq);
  const double l0 = losses[0][0].item<double>(), ln = losses[0][1].item<double>();
  const std::string load_after = LoadAvg();
  std::printf("ours (FullyShard/%s, plan %s) world %d: step mean %.2f ms min %.2f ms | %.0f "
              "tokens/s | CPU %.1f ms per step (all ranks) | loss0 %.6f last %.6f | load %s -> %s\n",
              f.backend.c_str(), f.plan.c_str(), f.world, mean_ms, min_ms, tokens * 1e3 / mean_ms,
              cpu_ms_all_ranks, l0, ln, load_before.c_str(), load_after.c_str());
  std::printf("ours: %s\n", malloc_note.c_str());
  if (!f.json_out.empty()) {
    nlohmann::json j = {{"side", "ours"},          {"backend", f.backend},
                        {"plan", f.plan},           {"world", f.world},
                        {"global_batch", f.global_batch}, {"seq", f.seq},
                        {"warmup", f.warmup},       {"steps", f.steps},
                        {"step_ms", ms},            {"step_ms_mean", mean_ms},
                        {"step_ms_min", min_ms},    {"tokens_per_s", tokens * 1e3 / mean_ms},
                        {"loss0", l0},              {"loss_last", ln},
                        {"cpu_ms_per_step", cpu_ms_all_ranks},
                        {"load_before", load_before}, {"load_after", load_after}};
    std::ofstream(f.json_out) << j.dump(1) << "\n";
  }
  const absl::Status waited = tpudist::test_support::WaitForRanks(ranks, absl::Seconds(f.timeout_s));
  if (!waited.ok()) std::fprintf(stderr, "train_vs_torch: %s\n", waited.ToString().c_str());
  mesh.reset();
  dist_job->Shutdown();
  const bool ok = waited.ok() && std::isfinite(l0) && std::isfinite(ln);
  std::fflush(stdout);
  return ok ? 0 : 1;
}
