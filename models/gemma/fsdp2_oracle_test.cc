// Our FullyShard (ParallelizeGemma's plan, 2 ranks as threads over the test
// backend) against torch's own FSDP2 `fully_shard` on the same tiny Gemma
// (data/tiny_gemma), the same batches and the same AdamW (wd 0.01):
// tests/oracles/fsdp2_gemma_oracle.py ran torch (Gloo, one process per rank)
// and wrote, per run, each rank's loss at 20 steps, the full step-0
// gradients (rank r's Shard(0) piece is torch.chunk(full, W)[r]), the final
// full weights and ||final - init|| per parameter
// (tests/oracles/fixtures/fsdp2/). Runs: fp32 and bf16 compute / fp32 reduce,
// each at lr 1e-4 (updates matter: 20 steps move weights ~10% of their
// scale) and the seed's 2e-5.
//
// Float-order noise is the floor: torch FSDP2 against itself at 1 and 2
// ranks (same math, world_size.json) ends 1.0e-4 (fp32; 2.5e-4 on an
// AVX-512 CPU) / 27% (bf16) of the distance trained apart at lr 1e-4, because AdamW's first steps are
// sign-like (about lr per element whatever the gradient's size), so an
// element whose tiny gradient rounds differently moves differently. Bounds
// (relative: of the loss, of the tensor's largest |element|, of the distance
// trained), with the figures measured when they were set (AVX2 CPU; then
// AVX-512 CPU, fixtures regenerated there, 2026-12-04; final weights also on
// an Intel Xeon with AMX, fixtures regenerated there, 2026-12-04 late):
//                     fp32                          bf16 compute
//   losses            1e-5  (2.3e-7; 3.0e-7)        2e-3  (6.5e-4; 7.3e-4)
//   step-0 grads      1e-5  (2.3e-7; 1.8e-7)        1e-2  (3.7e-3; 3.7e-3)
//   final weights     2e-4  (1.9e-5; 3.1e-5; 1.25e-4,  3e-2 (1.5e-2; 1.1e-2, fixture in bf16)
//                           lr 1e-4: embed_tokens, the
//                           same for the binary before
//                           and after that day's changes;
//                           1.69e-4 with the RMSNorm row
//                           loops, 2026-12-05), or torch's
//                           own 1-vs-2-rank gap on this
//                           metric x kWorldSlack where
//                           larger (9.6e-5 on the Xeon)
//   ||final - init||  3e-4  (3.7e-5; 1.4e-4 at lr 2e-5) 0.15 (5.8e-2; 6.4e-2)
// The fp32 weight bounds are under torch's own 1-vs-2-rank gap on either CPU
// (1.0e-4 / 2.5e-4 of the distance trained): float-order noise, not a bug.
// The fixtures are regenerated on the machine that runs the test (ctest's
// oracle_fixtures): committed floats are exact only for their CPU's kernels.
//   ||ours - torch|| / ||torch - init||: at most torch's own 1-vs-2-rank
//   figure (x kWorldSlack).
// At the 1e-3 lr the seed's model runs chaotic here (torch vs torch at 1 and
// 2 ranks: 28% fp32); WorldSizeGapIsNoBiggerThanTorchFsdp2s covers it.
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <torch/optim/adamw.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "fsdp/fully_shard/state_dict.h"
#include "testing/device_mesh_ranks.h"
#include "gtest/gtest.h"
#include "models/gemma/gemma_model.h"
#include "models/gemma/hf_checkpoint.h"
#include "models/gemma/parallelize_gemma.h"
#include "io/safetensors.h"
#include "testing/source_dir.h"

namespace tpudist::models::gemma {
namespace {

constexpr char kPle[] = "model.embed_tokens_per_layer.weight";
constexpr double kFp32Rel = 1e-5;
constexpr double kFp32FinalRel = 2e-4;
constexpr double kFp32TrainedRel = 3e-4;
constexpr double kBf16LossRel = 2e-3;
constexpr double kBf16GradRel = 1e-2;
constexpr double kBf16FinalRel = 3e-2;
constexpr double kBf16TrainedRel = 0.15;
constexpr double kWorldSlack = 3.0;

using test_support::SourceDir;

// $TPU_DIST_ORACLE_FIXTURES (ctest's regeneration on this CPU) when set, else
// the committed fixtures.
std::string Fsdp2FixtureDir() {
  const char* fresh = std::getenv("TPU_DIST_ORACLE_FIXTURES");
  if (fresh != nullptr && *fresh != '\0') return std::string(fresh) + "/fsdp2";
  return SourceDir() + "/tests/oracles/fixtures/fsdp2";
}

nlohmann::json TorchWorldGaps() {
  std::ifstream in(Fsdp2FixtureDir() + "/world_size.json");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded() || j.empty()) << Fsdp2FixtureDir() << "/world_size.json";
  return j.is_discarded() ? nlohmann::json::object() : j;
}

// torch FSDP2's own 1-vs-2-rank figure `field` at (lr, bf16):
// "apart_over_trained" (||w1 - w2|| / ||w1 - w0||) or "final_max_rel" (the
// largest final-weight gap of a tensor relative to its largest element;
// nullopt when the fixtures predate it).
std::optional<double> TorchWorldGap(double lr, bool bf16, const std::string& field = "apart_over_trained") {
  const nlohmann::json gaps = TorchWorldGaps();
  for (const auto& [key, g] : gaps.items()) {
    if (std::abs(g["lr"].get<double>() - lr) <= 1e-12 && g["mixed_precision"].get<bool>() == bf16) {
      if (!g.contains(field)) return std::nullopt;
      return g[field].get<double>();
    }
  }
  ADD_FAILURE() << "world_size.json has no lr " << lr << (bf16 ? " bf16" : " fp32") << " entry";
  return 0.0;
}

// One torch FSDP2 run as the oracle script saved it.
struct TorchRun {
  at::Tensor input_ids, attention_mask, labels;  // [steps, B, S] int64
  at::Tensor losses;                             // [steps, W] float64
  std::map<std::string, at::Tensor> grad0;       // full step-0 grads
  std::map<std::string, at::Tensor> final;       // full final weights
  std::map<std::string, double> trained;         // ||final - init||
  double lr = 0;
  int64_t steps = 0;
  int world = 0;
};

TorchRun LoadRun(const std::string& name) {
  TorchRun run;
  auto file = io::SafetensorsFile::Open(Fsdp2FixtureDir() + "/" + name + ".safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return run;
  const auto& f = **file;
  run.input_ids = f.Get("input_ids")->clone();
  run.attention_mask = f.Get("attention_mask")->clone();
  run.labels = f.Get("labels")->clone();
  run.losses = f.Get("losses")->clone();
  run.lr = f.Get("lr")->item<double>();
  run.steps = run.losses.size(0);
  run.world = static_cast<int>(f.Get("world_size")->item<int64_t>());
  for (const auto& [key, entry] : f.entries()) {
    const auto dot = key.find('.');
    if (dot == std::string::npos) continue;
    const std::string kind = key.substr(0, dot), param = key.substr(dot + 1);
    if (kind == "grad0") run.grad0[param] = f.Get(key)->to(at::kFloat);
    if (kind == "final") run.final[param] = f.Get(key)->to(at::kFloat);
    if (kind == "trained") run.trained[param] = f.Get(key)->item<double>();
  }
  return run;
}

double MaxRel(const at::Tensor& got, const at::Tensor& want) {
  const double scale = want.abs().max().item<double>();
  const double diff = (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

// What our side produced, for the comparisons (and the report).
struct OurRun {
  std::map<int, std::vector<double>> losses;            // rank -> per step
  std::map<std::string, std::map<int, at::Tensor>> grad0;  // name -> rank -> shard
  std::map<std::string, at::Tensor> final;               // rank 0's full dict
};

// Our FullyShard on `t`'s batches at `world` ranks (rank r takes rows
// [r * B / W, (r + 1) * B / W), as the oracle script does).
OurRun RunOurs(const TorchRun& t, int world, bool bf16) {
  at::set_num_threads(1);
  OurRun ours;
  std::mutex mu;
  const int64_t rows = t.input_ids.size(1) / world;
  test_support::RunMeshRanks(
      world,
      [&](const test_support::RankContext& ctx) {
        absl::StatusOr<fsdp::DeviceMesh> mesh = fsdp::InitDeviceMesh("cpu", {ctx.world_size}, {"dp"}, ctx.env);
        ASSERT_TRUE(mesh.ok()) << mesh.status();
        absl::StatusOr<GemmaForCausalLM> model = LoadGemmaFromHf(SourceDir() + "/data/tiny_gemma");
        ASSERT_TRUE(model.ok()) << model.status();
        GemmaParallelOptions popts;
        popts.param_dtype = bf16 ? std::optional<at::ScalarType>(at::kBFloat16) : std::nullopt;
        popts.reduce_dtype = at::kFloat;
        absl::StatusOr<fsdp::FsdpModule> root = ParallelizeGemma(*model, *mesh, popts);
        ASSERT_TRUE(root.ok()) << root.status();
        std::vector<at::Tensor> trainable;
        for (const at::Tensor& p : (*model)->parameters()) {
          if (p.requires_grad()) trainable.push_back(p);
        }
        torch::optim::AdamW opt(trainable, torch::optim::AdamWOptions(t.lr).weight_decay(0.01));
        for (int64_t s = 0; s < t.steps; ++s) {
          const int64_t r0 = ctx.rank * rows;
          opt.zero_grad();
          at::Tensor loss = (*model)
                                ->forward(t.input_ids[s].narrow(0, r0, rows), t.attention_mask[s].narrow(0, r0, rows),
                                          t.labels[s].narrow(0, r0, rows))
                                .loss;
          loss.backward();
          {
            std::lock_guard<std::mutex> l(mu);
            if (s == 0) {  // this rank's Shard(0) pieces
              for (auto& item : (*model)->named_parameters()) {
                if (item.value().grad().defined()) ours.grad0[item.key()][ctx.rank] = item.value().grad().clone();
              }
            }
            ours.losses[ctx.rank].push_back(loss.item<double>());
          }
          opt.step();
        }
        fsdp::StateDictOptions sd;
        sd.ignore_frozen_params = true;
        absl::StatusOr<fsdp::StateDict> dict = fsdp::GetModelStateDict(model->ptr(), *mesh, sd);
        ASSERT_TRUE(dict.ok()) << dict.status();
        if (ctx.rank == 0) {
          std::lock_guard<std::mutex> l(mu);
          ours.final = *dict;
        }
      },
      absl::Seconds(600));
  return ours;
}

struct Bounds {
  double loss_rel, grad_rel, final_rel, trained_rel;
};

void ExpectMatchesTorch(const std::string& run_name, bool bf16, const Bounds& b) {
  const TorchRun t = LoadRun(run_name);
  ASSERT_EQ(t.world, 2);
  ASSERT_GT(t.steps, 0);
  const OurRun ours = RunOurs(t, t.world, bf16);
  double max_loss = 0, max_grad = 0, max_final = 0, max_trained = 0;
  for (int r = 0; r < t.world; ++r) {
    ASSERT_EQ(ours.losses.at(r).size(), static_cast<size_t>(t.steps));
    for (int64_t s = 0; s < t.steps; ++s) {
      const double want = t.losses[s][r].item<double>();
      const double rel = std::abs(ours.losses.at(r)[s] - want) / std::abs(want);
      max_loss = std::max(max_loss, rel);
      EXPECT_LE(rel, b.loss_rel) << run_name << " step " << s << " rank " << r << ": " << ours.losses.at(r)[s]
                                 << " vs torch " << want;
    }
  }
  // Step-0 gradient shards: rank r holds torch.chunk(full, W)[r].
  for (const auto& [name, full] : t.grad0) {
    ASSERT_EQ(ours.grad0.count(name), 1u) << name << ": no grad on our side";
    for (int r = 0; r < t.world; ++r) {
      const at::Tensor want = full.chunk(t.world, 0)[r];
      const at::Tensor& got = ours.grad0.at(name).at(r);
      ASSERT_EQ(got.sizes(), want.sizes()) << name << " rank " << r;
      const double rel = MaxRel(got, want);
      max_grad = std::max(max_grad, rel);
      EXPECT_LE(rel, b.grad_rel) << run_name << " step-0 grad of " << name << " rank " << r;
    }
  }
  EXPECT_EQ(ours.grad0.count(kPle), 0u) << "the frozen PLE table got a grad";
  EXPECT_EQ(t.grad0.empty(), t.final.empty());
  if (!t.grad0.empty()) {
    EXPECT_EQ(ours.grad0.size(), t.grad0.size());
  }
  // Final weights: b.final_rel, or torch's own 1-vs-2-rank gap on the same
  // metric (x kWorldSlack) where that is larger -- float-order noise that
  // AdamW's sign-like first steps amplify element by element.
  const std::optional<double> torch_final_gap =
      t.final.empty() ? std::nullopt : TorchWorldGap(t.lr, bf16, "final_max_rel");
  const double final_bound = std::max(b.final_rel, kWorldSlack * torch_final_gap.value_or(0.0));
  for (const auto& [name, want] : t.final) {
    ASSERT_EQ(ours.final.count(name), 1u) << name;
    const double rel = MaxRel(ours.final.at(name), want);
    max_final = std::max(max_final, rel);
    EXPECT_LE(rel, final_bound) << run_name << " final " << name;
  }
  // Distance trained per parameter (every run, also those without weights).
  absl::StatusOr<GemmaForCausalLM> init = LoadGemmaFromHf(SourceDir() + "/data/tiny_gemma");
  ASSERT_TRUE(init.ok()) << init.status();
  auto init_params = (*init)->named_parameters();
  for (const auto& [name, want] : t.trained) {
    ASSERT_EQ(ours.final.count(name), 1u) << name;
    const double got = (ours.final.at(name).to(at::kDouble) - init_params[name].to(at::kDouble)).norm().item<double>();
    const double rel = std::abs(got - want) / want;
    max_trained = std::max(max_trained, rel);
    EXPECT_LE(rel, b.trained_rel) << run_name << " ||final - init|| of " << name << ": " << got << " vs " << want;
  }
  EXPECT_EQ(t.trained.size() + 1, static_cast<size_t>(init_params.size()));  // all but the PLE table
  // Whole model: how far ours ends from torch, relative to how far torch
  // trained, against how far torch ends from itself at another world size.
  double apart = 0, trained = 0;
  for (const auto& [name, want] : t.final) {
    apart += (ours.final.at(name).to(at::kDouble) - want.to(at::kDouble)).pow(2).sum().item<double>();
    trained += t.trained.at(name) * t.trained.at(name);
  }
  const double ratio = t.final.empty() ? 0 : std::sqrt(apart / trained);
  const double torch_gap = t.final.empty() ? 0 : TorchWorldGap(t.lr, bf16).value_or(0.0);
  EXPECT_LE(ratio, kWorldSlack * torch_gap) << run_name;
  std::cout << "[fsdp2 oracle] " << run_name << ": max rel diff loss " << max_loss << ", step-0 grad shard "
            << max_grad << ", final weight " << max_final << " (bound " << final_bound << "; torch 1 vs 2 ranks "
            << torch_final_gap.value_or(-1) << "), distance trained " << max_trained
            << "; ||ours - torch|| / ||torch - init|| " << ratio << " (torch 1 vs 2 ranks: " << torch_gap << ")\n";
}

TEST(Fsdp2Oracle, Fp32MatchesTorchFullyShard) {
  ExpectMatchesTorch("fp32", false, {kFp32Rel, kFp32Rel, kFp32FinalRel, kFp32TrainedRel});
}

TEST(Fsdp2Oracle, Fp32SeedLrMatchesTorchFullyShard) {
  ExpectMatchesTorch("fp32_seed", false, {kFp32Rel, kFp32Rel, kFp32FinalRel, kFp32TrainedRel});
}

TEST(Fsdp2Oracle, Bf16MixedPrecisionMatchesTorchFullyShard) {
  ExpectMatchesTorch("bf16", true, {kBf16LossRel, kBf16GradRel, kBf16FinalRel, kBf16TrainedRel});
}

TEST(Fsdp2Oracle, Bf16SeedLrMatchesTorchFullyShard) {
  ExpectMatchesTorch("bf16_seed", true, {kBf16LossRel, kBf16GradRel, kBf16FinalRel, kBf16TrainedRel});
}

// Issue 14's world-size question. gemma_finetune at 1 and 2 ranks (same
// global batches, equal token counts per rank) gave equal losses at lr 0 but
// runs ~1% of the distance trained apart after updates. The oracle script
// trained torch FSDP2 the same way at 1 and 2 ranks (no padding: the two are
// the same math) and recorded how far apart torch's own runs end
// (world_size.json). Ours, on the same batches, must not be further apart
// than torch's (x kWorldSlack, plus a floor for runs torch keeps within float
// noise), and the step-0 gradients of 1 and 2 ranks must agree as torch's do.

struct WorldGap {
  double apart_over_trained = 0, max_loss_gap = 0, step0_grad_max_rel = 0;
};

WorldGap OurWorldGap(const TorchRun& t, bool bf16) {
  const OurRun one = RunOurs(t, 1, bf16), two = RunOurs(t, 2, bf16);
  absl::StatusOr<GemmaForCausalLM> init = LoadGemmaFromHf(SourceDir() + "/data/tiny_gemma");
  EXPECT_TRUE(init.ok()) << init.status();
  WorldGap gap;
  if (!init.ok()) return gap;
  auto init_params = (*init)->named_parameters();
  double apart = 0, trained = 0;
  for (const auto& [name, w1] : one.final) {
    if (!init_params.contains(name) || name == kPle) continue;
    apart += (w1.to(at::kDouble) - two.final.at(name).to(at::kDouble)).pow(2).sum().item<double>();
    trained += (w1.to(at::kDouble) - init_params[name].to(at::kDouble)).pow(2).sum().item<double>();
  }
  gap.apart_over_trained = std::sqrt(apart / trained);
  for (int64_t s = 0; s < t.steps; ++s) {
    const double two_mean = (two.losses.at(0)[s] + two.losses.at(1)[s]) / 2;
    gap.max_loss_gap = std::max(gap.max_loss_gap, std::abs(one.losses.at(0)[s] - two_mean));
  }
  for (const auto& [name, shards] : one.grad0) {
    const at::Tensor full2 = at::cat({two.grad0.at(name).at(0), two.grad0.at(name).at(1)}, 0);
    gap.step0_grad_max_rel = std::max(gap.step0_grad_max_rel, MaxRel(full2, shards.at(0)));
  }
  return gap;
}

TEST(Fsdp2Oracle, WorldSizeGapIsNoBiggerThanTorchFsdp2s) {
  const nlohmann::json torch_gaps = TorchWorldGaps();
  auto file = io::SafetensorsFile::Open(Fsdp2FixtureDir() + "/world_size_batches.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  TorchRun t;
  t.input_ids = (*file)->Get("input_ids")->clone();  // [steps, B, S], no padding
  t.attention_mask = at::ones_like(t.input_ids);
  t.labels = t.input_ids;
  t.steps = t.input_ids.size(0);
  ASSERT_FALSE(torch_gaps.empty());
  for (const auto& [key, g] : torch_gaps.items()) {
    t.lr = g["lr"].get<double>();
    const bool bf16 = g["mixed_precision"].get<bool>();
    const WorldGap ours = OurWorldGap(t, bf16);
    const double torch_apart = g["apart_over_trained"].get<double>();
    const double torch_grad = g["step0_grad_max_rel"].get<double>();
    std::cout << "[fsdp2 oracle] world 1 vs 2, " << key << ": ||w1 - w2|| / ||w1 - w0|| ours " << ours.apart_over_trained
              << " torch " << torch_apart << "; max loss gap ours " << ours.max_loss_gap << " torch "
              << g["max_loss_gap"].get<double>() << "; step-0 grad max rel ours " << ours.step0_grad_max_rel
              << " torch " << torch_grad << "\n";
    EXPECT_LE(ours.apart_over_trained, kWorldSlack * torch_apart + 1e-4) << key;
    EXPECT_LE(ours.step0_grad_max_rel, kWorldSlack * torch_grad + (bf16 ? 1e-3 : 1e-6)) << key;
  }
}

}  // namespace
}  // namespace tpudist::models::gemma
