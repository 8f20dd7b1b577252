#include "train/finetune_trainer.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <utility>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "distributed/job.h"
#include "train/async_checkpoint_writer.h"
#include "train/checkpoint_manager.h"
#include "train/checkpoint_storage.h"
#include "train/distributed_sampler.h"
#include "train/dolly_dataset.h"
#include "train/finetune_checkpoint.h"
#include "train/hf_tokenizer_call.h"
#include "train/job_fingerprint.h"
#include "train/nonfinite_check.h"
#include "train/progress_reporter.h"
#include "train/rank_agreement.h"
#include "train/resume_plan.h"
#include "train/run_dir_lock.h"
#include "train/run_start.h"
#include "train/tokenized_dataset.h"
#include "train/training_flags.h"
#include "fsdp/device_mesh.h"
#include "fsdp/job_mesh.h"
#include "fsdp/fully_shard/dcp_checkpoint.h"
#include "fsdp/fully_shard/mesh_agreement.h"
#include "fsdp/mesh_collectives.h"
#include "fsdp/parallelize_module.h"
#include "models/gemma/hf_checkpoint.h"
#include "models/gemma/model_dir.h"
#include "models/gemma/parallelize_gemma.h"
#include "models/gemma/tokenizer.h"
#include "nn/fused_adamw.h"
#include "tpu_runtime/coordination/coordination_client.h"
#include "tpu_runtime/coordination/coordination_runtime.h"

namespace tpudist::train {
namespace {

namespace gemma = ::tpudist::models::gemma;
namespace coord = ::tpudist::tpu_runtime::coordination;

// The error with "rank R: <stage>: " in front; its payloads (the exit code
// distributed::Job attached) kept.
absl::Status Annotate(const absl::Status& s, int rank, absl::string_view stage) {
  return distributed::WithContext(s, absl::StrCat("rank ", rank, ": ", stage));
}

// tp == 1: the 1-D mesh {world} ("dp"); tp > 1: {world / tp, tp} ("dp", "tp"),
// tp inner (the tp ranks of one replica are consecutive, on one host when tp
// divides the devices per host); hsdp: {replicas, world / replicas}
// ("dp_replicate", "dp_shard"), dp_shard inner (ranks are slice-major, so
// with replicas == the slice count one dp_shard group is one slice and each
// dp_replicate group holds one rank per slice, equal in-slice positions).
// On the job's groups; group names carry their ranks (GroupNameFor), so the
// groups of different dims never share a name.
// REQUIRES: tp divides world; replicas divides world (hsdp).
absl::StatusOr<fsdp::DeviceMesh> MakeMesh(const distributed::Job& job, int64_t tp, bool hsdp, int64_t replicas) {
  const int world = job.info().world_size;
  if (hsdp) {
    return fsdp::InitJobDeviceMesh(
        job, {"tpu", {replicas, world / replicas}, {"dp_replicate", "dp_shard"}, "finetune_dp"});
  }
  if (tp == 1) return fsdp::InitJobDeviceMesh(job, {"tpu", {world}, {"dp"}, "finetune_dp"});
  return fsdp::InitJobDeviceMesh(job, {"tpu", {world / tp, tp}, {"dp", "tp"}, "finetune_dp"});
}

absl::StatusOr<TokenizedDataset> LoadData(const FineTuneConfig& c, const gemma::Tokenizer& tok) {
  // A row far longer than max_seq_len tokens is refused before it is held
  // in memory or tokenized (dolly_dataset.h).
  absl::StatusOr<std::vector<DollyExample>> rows =
      LoadDollySplit(c.dataset, c.dataset_split, MaxRowBytesForSeqLen(c.max_seq_len));
  if (!rows.ok()) return rows.status();
  // The seed's tokenizer(..., truncation=True, max_length, padding="max_length"):
  // specials, padding and truncation sides as the model directory's HF files say.
  absl::StatusOr<TokenizeOptions> t =
      SeedTokenizeOptions(c.model_dir, c.max_seq_len, static_cast<int>(tok.pad_id()),
                          tok.add_bos() ? static_cast<int>(tok.bos_id()) : -1);
  if (!t.ok()) return t.status();
  // Right truncation keeps the head: tokenize only as far as max_seq_len + 1
  // ids (one more than fits, so MakeRow still sees the row as truncated);
  // EncodeHead's ids are exactly Encode's first ones (tokenizer.h).
  const int64_t head = t->truncation_side == Side::kRight ? c.max_seq_len + 1 : -1;
  Encoder encode = [&tok, head](absl::string_view text) -> absl::StatusOr<std::vector<int>> {
    std::vector<int64_t> ids = head >= 0 ? tok.EncodeHead(text, head, /*add_bos=*/false)
                                         : tok.Encode(text, /*add_bos=*/false);
    return std::vector<int>(ids.begin(), ids.end());
  };
  return TokenizedDataset::Create(*rows, encode, *t, c.include_context);
}

// Mean over every rank of the mesh of `value`: the mean along each dim in
// turn (groups along one dim have equal sizes).
absl::StatusOr<double> AllReduceAvg(const fsdp::DeviceMesh& mesh, double value) {
  at::Tensor t = at::full({1}, value, at::kDouble);  // [1]
  for (int d = 0; d < mesh.ndim(); ++d) {
    absl::StatusOr<at::Tensor> mean = fsdp::AllReduceAlongDim(mesh, d, t, fsdp::ReduceOp::kAvg);
    if (!mean.ok()) return mean.status();
    t = *mean;
  }
  return t.item<double>();
}

// Sum over every rank of the mesh: the sum along each dim in turn.
absl::StatusOr<at::Tensor> AllReduceSum(const fsdp::DeviceMesh& mesh, at::Tensor t) {
  for (int d = 0; d < mesh.ndim(); ++d) {
    absl::StatusOr<at::Tensor> sum = fsdp::AllReduceAlongDim(mesh, d, t, fsdp::ReduceOp::kSum);
    if (!sum.ok()) return sum.status();
    t = *sum;
  }
  return t;
}

// Every rank took `v` from the same numbers (nonfinite_check.h). The rank it
// names reports the job error first, so that the launcher blames it; the
// others give that report a bounded moment to arrive before they return
// the same error (and exit as followers of it).
absl::Status StopForNonFinite(const NonFiniteVerdict& v, int rank, coord::CoordinationRuntime& runtime,
                              absl::Duration timeout) {
  if (v.rank == rank) {
    runtime.ReportFailure(v.error);
  } else if (runtime.client() != nullptr) {
    runtime.client()->PollForError(std::min(timeout, absl::Seconds(5))).IgnoreError();
  }
  return v.error;
}

// What an epoch's checkpoint saves from this rank, with names in the same
// order on every rank: the model's parameters (shards), the frozen PLE
// table's fp32 copy, the AdamW moments of each trainable parameter
// (undefined before its first step).
struct SavedTensors {
  std::vector<at::Tensor> tensors;
  std::vector<std::string> names;
};
SavedTensors TensorsToSave(const gemma::GemmaForCausalLM& model, const at::Tensor& ple_fp32,
                           absl::Span<const at::Tensor> trainable, absl::Span<const std::string> trainable_names,
                           torch::optim::AdamW& opt) {
  SavedTensors out;
  for (const auto& p : model->named_parameters()) {
    out.tensors.push_back(p.value());
    out.names.push_back(p.key());
  }
  out.tensors.push_back(ple_fp32);
  out.names.push_back("per-layer embedding (fp32 copy)");
  for (size_t i = 0; i < trainable.size(); ++i) {
    auto it = opt.state().find(trainable[i].unsafeGetTensorImpl());
    const auto* st = it == opt.state().end() ? nullptr
                                             : dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get());
    out.tensors.push_back(st != nullptr ? st->exp_avg() : at::Tensor());
    out.names.push_back(absl::StrCat("AdamW exp_avg of ", trainable_names[i]));
    out.tensors.push_back(st != nullptr ? st->exp_avg_sq() : at::Tensor());
    out.names.push_back(absl::StrCat("AdamW exp_avg_sq of ", trainable_names[i]));
  }
  return out;
}

JobSpec SpecOf(const FineTuneConfig& c, int world, int64_t rows) {
  JobSpec spec;
  spec.model_dir = c.model_dir;
  spec.dataset = c.dataset;
  spec.dataset_split = c.dataset_split;
  spec.dataset_rows = rows;
  spec.include_context = c.include_context;
  spec.max_seq_len = c.max_seq_len;
  spec.batch_size_per_device = c.batch_size_per_device;
  spec.num_epochs = c.num_epochs;
  spec.lr = c.lr;
  spec.weight_decay = c.weight_decay;
  spec.seed = c.seed;
  spec.bf16 = c.bf16;
  spec.world_size = world;
  spec.tensor_parallel = c.tp;
  return spec;
}

}  // namespace

std::string DefaultRunName(const std::string& job_id) {
  return job_id.empty() ? "gemma_finetune" : absl::StrCat("gemma_finetune_", job_id);
}

absl::StatusOr<FineTuneResult> RunFineTune(const tpu_runtime::RankInfo& info, const FineTuneConfig& c) {
  const int rank = info.rank, world = info.world_size;
  if (c.storage_path.empty()) return absl::InvalidArgumentError("--storage-path (or STORAGE_PATH) is required");
  // A URI storage path: checkpoints are committed under the local staging
  // path, then copied to the URI; resume fetches from it (checkpoint_storage.h).
  const bool remote_storage = IsStorageUri(c.storage_path);
  const std::string local_root = !remote_storage      ? c.storage_path
                                 : c.staging_path.empty() ? std::string(kDefaultStagingPath)
                                                          : c.staging_path;
  if (remote_storage && !StorageUrisSupported()) {
    return CheckpointStorage::Open({c.storage_path, "run", {}}).status();  // says why
  }
  if (absl::Status s = ValidateTrainingFlags(
          {c.num_epochs, c.batch_size_per_device, c.max_seq_len, c.lr, c.weight_decay, c.tp});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateTensorParallel(c.tp, world); !s.ok()) return s;
  // HSDP's replicas: --dp-replicate, else the discovered slice count.
  const int64_t replicas = !c.hsdp ? 1 : c.dp_replicate > 0 ? c.dp_replicate : info.num_slices;
  if (c.hsdp) {
    if (absl::Status s = ValidateHsdp(replicas, world, c.tp); !s.ok()) return s;
  }
  // The data-parallel coordinates: the tp ranks of one replica see one batch
  // (HSDP: every rank is a data-parallel rank, as on the 1-D mesh).
  const int dp_world = static_cast<int>(world / c.tp), dp_rank = static_cast<int>(rank / c.tp);
  if (info.restart_count > c.max_failures) {
    return absl::FailedPreconditionError(absl::StrCat("attempt ", info.restart_count, " exceeds --max-failures ",
                                                      c.max_failures));
  }
  // Data first: a bad dataset fails fast, before any rendezvous.
  // The tokenizer's ids must fit the model's vocab_size (config.json).
  absl::StatusOr<std::unique_ptr<gemma::Tokenizer>> tok = gemma::LoadTokenizerForModel(c.model_dir);
  if (!tok.ok()) return Annotate(tok.status(), rank, "tokenizer");
  absl::StatusOr<TokenizedDataset> data = LoadData(c, **tok);
  if (!data.ok()) return Annotate(data.status(), rank, "dataset");
  absl::StatusOr<DistributedSampler> sampler =
      DistributedSampler::Create({data->size(), dp_world, dp_rank, /*shuffle=*/true, c.seed, /*drop_last=*/true});
  if (!sampler.ok()) return Annotate(sampler.status(), rank, "sampler");
  const int64_t num_batches = sampler->NumBatches(c.batch_size_per_device);

  // The job (distributed/job.h): coordination, the store and the groups
  // (options by distributed/group_config.h's one rule). A startup failure
  // caused by another rank (one never registered) carries exit code 75.
  distributed::JobOptions jo;
  jo.name = "gemma_finetune";
  jo.group.group_name = "finetune_dp";
  jo.group.timeout = c.timeout;
  absl::StatusOr<std::unique_ptr<distributed::Job>> job = distributed::Job::Start(info, jo);
  if (!job.ok()) return Annotate(job.status(), rank, "coordination");
  coord::CoordinationRuntime& runtime = *(*job)->runtime();
  // Everything after the rendezvous runs under Job::Run: an error here (or an
  // exception) reaches every rank at once, and the exit code it carries says
  // whether it was this rank's own failure or a peer's.
  absl::StatusOr<FineTuneResult> out = absl::UnknownError("not run");
  auto train = [&]() -> absl::StatusOr<FineTuneResult> {
    // Rank 0 owns the run directory for the whole attempt (run_dir_lock.h):
    // a second job on it fails here, before it reads or writes anything. A
    // restarted attempt waits a little for the previous rank 0 to be gone.
    const std::string run_name = c.run_name.empty() ? DefaultRunName(info.job_id) : c.run_name;
    absl::StatusOr<std::string> run_dir = RunDirPath(local_root, run_name);
    if (!run_dir.ok()) return Annotate(run_dir.status(), rank, "--run-name");
    std::optional<RunDirLock> lock;
    if (rank == 0) {
      absl::StatusOr<RunDirLock> l =
          RunDirLock::Acquire(*run_dir, info.restart_count > 0 ? absl::Seconds(30) : absl::ZeroDuration());
      if (!l.ok()) return Annotate(l.status(), rank, "lock");
      lock.emplace(*std::move(l));
    }
    const c10::intrusive_ptr<c10d::Store>& store = (*job)->store();  // under "gemma_finetune"
    // Every rank must train the same job: same model files, data and flags.
    absl::StatusOr<JobFingerprint> fingerprint = ComputeJobFingerprint(SpecOf(c, world, data->size()));
    if (!fingerprint.ok()) return Annotate(fingerprint.status(), rank, "job fingerprint");
    if (absl::Status s = CheckRanksAgree(*store, rank, *fingerprint, c.timeout); !s.ok()) return s;

    // Where this attempt starts: rank 0 decides (resume_plan.h), all follow.
    std::unique_ptr<CheckpointManager> mgr;
    std::unique_ptr<CheckpointStorage> storage;  // rank 0, URI storage paths only
    std::optional<MetricsLog> metrics;
    absl::StatusOr<ResumePlan> plan = ResumePlan{};
    if (rank == 0) {
      CheckpointManagerOptions mo;
      mo.storage_path = local_root;
      mo.run_name = run_name;
      mo.num_to_keep = c.num_to_keep;
      absl::StatusOr<std::unique_ptr<CheckpointManager>> m = CheckpointManager::Open(mo);
      if (m.ok() && remote_storage) {  // the newest verified remote checkpoint, made local
        absl::StatusOr<std::unique_ptr<CheckpointStorage>> s = CheckpointStorage::Open({c.storage_path, run_name, {}});
        absl::StatusOr<std::optional<std::string>> got = s.ok() ? (*s)->FetchNewestVerified((*m)->run_dir())
                                                                : absl::StatusOr<std::optional<std::string>>(s.status());
        if (got.ok()) {
          storage = *std::move(s);
        } else {
          m = absl::Status(got.status().code(), absl::StrCat("storage '", RedactedUri(c.storage_path), "': ",
                                                             got.status().message()));
        }
      }
      absl::StatusOr<MetricsLog> log = m.ok() ? MetricsLog::Open((*m)->run_dir()) : m.status();
      if (log.ok()) {
        mgr = std::move(*m);
        metrics = std::move(*log);
        plan = PlanStart(SpecOf(c, world, data->size()), c.resume_mismatched, num_batches, *mgr, *metrics);
      } else {
        plan = log.status();
      }
    }
    // Rank 0's failure to start is the job's root cause: report it before
    // the others read it from the store and fail too.
    if (rank == 0 && !plan.ok()) runtime.ReportFailure(plan.status());
    absl::StatusOr<RunStart> start = ShareStart(rank, plan, *store, c.timeout);
    if (!start.ok()) return Annotate(start.status(), rank, "start");
    FineTuneResult result;
    if (start->kind == StartKind::kFinished) {
      result.already_finished = true;
      result.latest_checkpoint = start->checkpoint;
      if (rank == 0) {
        const int64_t done = plan->epochs_done;
        std::optional<EpochMetrics> logged = LoggedEpoch(metrics->path(), done);
        result.final_metrics_logged = logged.has_value();
        result.final_metrics = logged.value_or(EpochMetrics{});
        result.final_metrics.epoch = done;
        if (!logged) result.final_metrics.loss = plan->checkpoint->metadata.loss;
      }
      (*job)->Shutdown();
      return result;
    }

    absl::StatusOr<fsdp::DeviceMesh> mesh = MakeMesh(**job, c.tp, c.hsdp, replicas);
    if (!mesh.ok()) return Annotate(mesh.status(), rank, "device mesh");
    if (rank == 0 && c.hsdp) {
      printf("HSDP: mesh %lld x %lld (dp_replicate x dp_shard), dp_replicate from %s\n",
             static_cast<long long>(replicas), static_cast<long long>(world / replicas),
             c.dp_replicate > 0 ? "--dp-replicate" : absl::StrCat("the job's ", info.num_slices, " slice(s)").c_str());
    } else if (rank == 0 && info.num_slices > 1) {
      printf("%d slices: 1-D FSDP over all %d ranks (--hsdp shards inside each slice and replicates across them)\n",
             info.num_slices, world);
    }

    const int64_t flat_rank = fsdp::MeshFlatRank(*mesh);  // == rank: the mesh is row-major over the world
    absl::StatusOr<gemma::GemmaForCausalLM> model = gemma::LoadGemmaFromHf(c.model_dir);
    if (!model.ok()) return Annotate(model.status(), rank, "model");
    at::Tensor ple_fp32 = gemma::PleWeight(**model);
    if (ple_fp32.defined()) ple_fp32 = ple_fp32.detach().clone();
    gemma::GemmaParallelOptions popts;
    if (!c.bf16) popts.param_dtype = std::nullopt;
    absl::StatusOr<fsdp::FsdpModule> root = gemma::ParallelizeGemma(*model, *mesh, popts);
    if (!root.ok()) return Annotate(root.status(), rank, "parallelize");
    std::vector<at::Tensor> trainable;
    std::vector<std::string> trainable_names;
    for (const auto& p : (*model)->named_parameters()) {
      if (!p.value().requires_grad()) continue;
      trainable.push_back(p.value());
      trainable_names.push_back(p.key());
    }
    // One fused AdamW kernel call per dtype; same state and checkpoints as
    // torch::optim::AdamW (nn/fused_adamw.h).
    ::tpudist::nn::FusedAdamW opt(trainable, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));

    CheckpointTarget target;
    target.model = *model;
    target.mesh = &*mesh;
    target.optimizer = &opt;
    target.store = store;
    target.ple_fp32 = ple_fp32;
    target.model_dir = c.model_dir;
    target.dcp_export = c.dcp_export;
    if (rank == 0) target.job = plan->job;
    target.timeout = c.timeout;
    TrainerState expect;
    expect.seed = c.seed;
    expect.world_size = world;
    expect.dataset_size = data->size();
    expect.dp_replicate = replicas;

    int64_t start_epoch = 0, start_step = 0;
    if (start->kind == StartKind::kResume) {
      const std::string& from = start->checkpoint;
      absl::StatusOr<TrainerState> st = RestoreFineTuneCheckpoint(target, from, expect, c.resume_mismatched);
      if (!st.ok()) return Annotate(st.status(), rank, "restore");
      start_epoch = st->epoch;
      start_step = st->step;
      if (start_step >= num_batches) ++start_epoch, start_step = 0;
      result.resumed_from_epoch = start_epoch;
      result.latest_checkpoint = from;
      result.final_metrics.loss = st->loss;
      result.final_metrics.epoch = st->epoch + 1;
      if (rank == 0) printf("Resuming from %s (epoch %lld, step %lld)\n", from.c_str(),
                            static_cast<long long>(start_epoch + 1), static_cast<long long>(start_step));
    } else if (!c.init_from_dcp.empty()) {
      absl::StatusOr<bool> with_optim = fsdp::DcpCheckpointHasOptimizerState(c.init_from_dcp);
      absl::Status s = with_optim.ok() ? fsdp::LoadDcpCheckpoint(model->ptr(), *mesh, c.init_from_dcp,
                                                                 *with_optim ? &opt : nullptr)
                                       : with_optim.status();
      if (!s.ok()) return Annotate(s, rank, "init from DCP checkpoint");
      if (rank == 0) printf("Starting from DCP checkpoint %s (%s)\n", c.init_from_dcp.c_str(),
                            *with_optim ? "weights and AdamW state" : "weights");
    }

    // --async-checkpoint: the save in flight and the epoch it is for (rank 0
    // appends that epoch's metrics and uploads once it has committed).
    CheckpointStaging staging;
    std::optional<AsyncCheckpointWriter> writer;
    if (c.async_checkpoint) writer.emplace(AsyncCheckpointWriterOptions{store, rank, world, absl::StrCat("finetune/async_ckpt/attempt", info.restart_count), c.timeout});
    std::optional<EpochMetrics> in_flight_metrics;
    auto after_commit = [&](const std::string& path, const EpochMetrics& em) -> absl::Status {
      if (rank != 0) return absl::OkStatus();
      result.latest_checkpoint = path;
      if (storage) {
        if (absl::Status s = storage->Upload(path); !s.ok()) return Annotate(s, rank, "checkpoint upload");
      }
      if (absl::Status s = metrics->Append(em); !s.ok()) return Annotate(s, rank, "metrics");
      return absl::OkStatus();
    };
    auto finish_async = [&]() -> absl::Status {
      if (!writer || !writer->in_flight()) return absl::OkStatus();
      absl::StatusOr<std::string> path = writer->Wait();
      if (!path.ok()) return Annotate(path.status(), rank, "asynchronous checkpoint");
      const EpochMetrics em = *in_flight_metrics;
      in_flight_metrics.reset();
      return after_commit(*path, em);
    };

    ProgressOptions po;
    po.enabled = rank == 0;
    po.tty = IsTerminal(stdout);
    po.plain_every = std::max<int64_t>(1, num_batches / 4);
    ProgressReporter progress(std::cout, po);
    for (int64_t epoch = start_epoch; epoch < c.num_epochs; ++epoch, start_step = 0) {
      sampler->SetEpoch(epoch);
      const absl::Time t0 = absl::Now();
      progress.BeginEpoch(epoch + 1, c.num_epochs, num_batches);
      double loss_sum = 0.0;
      int64_t steps = 0;
      for (int64_t step = start_step; step < num_batches; ++step) {
        const bool die_here = rank == c.die_rank || (c.die_slice >= 0 && info.slice_index == c.die_slice);
        if (die_here && info.restart_count == 0 && epoch == c.die_epoch && step == c.die_step) {
          fprintf(stderr, "gemma_finetune: rank %d: %s at epoch %lld step %lld, raising SIGKILL\n", rank,
                  rank == c.die_rank ? "--die-rank" : "--die-slice", static_cast<long long>(epoch),
                  static_cast<long long>(step));
          fflush(stderr);
          raise(SIGKILL);
        }
        absl::StatusOr<std::vector<int64_t>> ids = sampler->BatchIndices(step, c.batch_size_per_device);
        if (!ids.ok()) return Annotate(ids.status(), rank, "sampler");
        absl::StatusOr<Batch> batch = data->MakeBatch(*ids);
        if (!batch.ok()) return Annotate(batch.status(), rank, "batch");
        opt.zero_grad();
        at::Tensor loss = (*model)->forward(batch->input_ids, batch->attention_mask, batch->labels).loss;
        loss.backward();
        // Gradients TP left partial over tp (none on a 1-D mesh).
        if (absl::Status s = fsdp::AllReducePartialGrads(**model); !s.ok()) return Annotate(s, rank, "backward");
        const double l = loss.item<double>();
        // Non-finite loss or gradient norm on any rank: every rank stops here,
        // before the optimizer step (nonfinite_check.h; one all-reduce of
        // 3 doubles per rank).
        absl::StatusOr<at::Tensor> numerics =
            AllReduceSum(*mesh, PackStepNumerics(MeasureStep(l, trainable), flat_rank, world));
        if (!numerics.ok()) return Annotate(numerics.status(), rank, "non-finite check");
        if (NonFiniteVerdict v = CheckStepNumerics(*numerics, world, {epoch + 1, c.num_epochs, step + 1, num_batches},
                                                   trainable_names);
            !v.ok()) {
          return StopForNonFinite(v, rank, runtime, c.timeout);
        }
        opt.step();
        loss_sum += l;
        ++steps;
        progress.Update(step + 1, l);
      }
      progress.EndEpoch();
      EpochMetrics m;
      m.epoch = epoch + 1;
      absl::StatusOr<double> mean_loss = AllReduceAvg(*mesh, steps > 0 ? loss_sum / steps : 0.0);
      if (!mean_loss.ok()) return Annotate(mean_loss.status(), rank, "epoch loss");
      m.loss = *mean_loss;
      m.steps = steps;
      m.epoch_time_s = absl::ToDoubleSeconds(absl::Now() - t0);
      m.tokens_per_s = TokensPerSecond(steps, c.batch_size_per_device * dp_world, c.max_seq_len, m.epoch_time_s);
      m.timestamp = absl::Now();
      if (rank == 0) {
        printf("%s\n", FormatEpochLine(m, c.num_epochs).c_str());
        fflush(stdout);
      }
      // No checkpoint of non-finite weights or optimizer moments.
      {
        const SavedTensors saved = TensorsToSave(*model, ple_fp32, trainable, trainable_names, opt);
        const double bad = static_cast<double>(FirstNonFinite(saved.tensors) + 1);  // 0: none
        absl::StatusOr<at::Tensor> agreed = AllReduceSum(*mesh, PackSlots({bad}, flat_rank, world));
        if (!agreed.ok()) return Annotate(agreed.status(), rank, "non-finite check");
        if (NonFiniteVerdict v = CheckSavedTensors(*agreed, world, {epoch + 1, c.num_epochs, 0, num_batches},
                                                   saved.names);
            !v.ok()) {
          return StopForNonFinite(v, rank, runtime, c.timeout);
        }
      }
      TrainerState st = expect;
      st.epoch = epoch;
      st.step = num_batches;
      st.loss = m.loss;
      const absl::Time save_t0 = absl::Now();
      if (writer) {
        if (absl::Status s = finish_async(); !s.ok()) return s;  // at most one save in flight
        absl::Status s = StartAsyncFineTuneCheckpoint(target, mgr.get(), st, epoch, &staging, &*writer);
        if (!s.ok()) return Annotate(s, rank, "checkpoint staging");
        in_flight_metrics = m;
      } else {
        absl::StatusOr<std::string> saved = SaveFineTuneCheckpoint(target, mgr.get(), st, epoch);
        if (!saved.ok()) return Annotate(saved.status(), rank, "checkpoint");
        if (absl::Status s = after_commit(*saved, m); !s.ok()) return s;
      }
      if (rank == 0) {
        printf("Checkpoint of epoch %lld: training blocked %.3fs (%s)\n", static_cast<long long>(epoch + 1),
               absl::ToDoubleSeconds(absl::Now() - save_t0), writer ? "async: staging" : "sync");
        fflush(stdout);
      }
      result.epochs.push_back(m);
      result.final_metrics = m;
    }
    if (absl::Status s = finish_async(); !s.ok()) return s;  // the last save is committed
    if (absl::Status s = fsdp::AgreeOnStatus(*mesh, absl::OkStatus(), "end of training"); !s.ok()) {
      return Annotate(s, rank, "final barrier");
    }
    return result;
  };
  absl::Status status = (*job)->Run([&] {
    out = train();
    return out.status();
  });
  if (!status.ok()) return status;  // also an exception, which left `out` unset
  return out;
}

}  // namespace tpudist::train
