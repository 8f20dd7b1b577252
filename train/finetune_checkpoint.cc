#include "train/finetune_checkpoint.h"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "collectives/exception_message.h"
#include "train/checkpoint_file_reader.h"
#include "train/checkpoint_metadata.h"
#include "fsdp/fully_shard/dcp_checkpoint.h"
#include "fsdp/fully_shard/mesh_agreement.h"
#include "fsdp/fully_shard/optimizer_checkpoint.h"
#include "fsdp/fully_shard/sharded_checkpoint.h"
#include "fsdp/fully_shard/state_dict.h"
#include "models/gemma/hf_checkpoint.h"

namespace tpudist::train {
namespace {

constexpr char kShardsDir[] = "shards";
constexpr char kDcpDir[] = "dcp";
constexpr char kTrainerState[] = "trainer_state.json";
constexpr char kPleName[] = "model.embed_tokens_per_layer.weight";

std::chrono::milliseconds Ms(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Every rank of the mesh (dp x tp too) has arrived; times out with the mesh.
absl::Status Barrier(const CheckpointTarget& t) {
  return fsdp::AgreeOnStatus(*t.mesh, absl::OkStatus(), "checkpoint: waiting for every rank's files");
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  errno = 0;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    // ofstream keeps errno from the failing open/write/close (e.g. ENOSPC).
    const int err = errno;
    return absl::InternalError(absl::StrCat("cannot write ", path, err != 0 ? ": " : "",
                                            err != 0 ? std::strerror(err) : ""));
  }
  return absl::OkStatus();
}

// Rank 0: the gathered full state dict into a fresh unsharded model, saved
// in HF form (fp32) with the tokenizer.
absl::Status ExportHf(const CheckpointTarget& t, const fsdp::StateDict& full, const std::string& dir) {
  models::gemma::GemmaForCausalLM fresh(t.model->config());
  at::NoGradGuard no_grad;
  for (auto& item : fresh->named_parameters(/*recurse=*/true)) {
    auto it = full.find(item.key());
    if (it != full.end()) {
      item.value().copy_(it->second);
    } else if (item.key() == kPleName && t.ple_fp32.defined()) {
      item.value().copy_(t.ple_fp32);
    } else {
      return absl::InternalError(absl::StrCat("checkpoint export: no value for ", item.key()));
    }
  }
  for (auto& item : fresh->named_buffers(/*recurse=*/true)) {
    auto it = full.find(item.key());
    if (it != full.end()) item.value().copy_(it->second);
  }
  models::gemma::SaveOptions so;
  so.dtype = at::kFloat;
  so.copy_tokenizer_from = t.model_dir;
  return models::gemma::SaveGemmaAsHf(*fresh, dir, so);
}

// checkpoint.json of `dir`, checked against its manifest_crc32 and parsed
// (it carries the CRC-32s to check). An I/O error (after retries) stays one.
absl::StatusOr<CheckpointMetadata> ReadVerifiedMetadata(const CheckpointFileReader& reader,
                                                        const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kCheckpointMetadataFile);
  absl::StatusOr<std::string> text = reader.ReadFile(path);
  if (!text.ok()) {
    if (IsCheckpointIoError(text.status())) return text.status();
    return absl::DataLossError(absl::StrCat("cannot read ", path, ": ", text.status().message()));
  }
  return ParseCheckpointMetadata(*text, path);
}

// Which AdamW state file this rank writes and reads. On an HSDP mesh
// ("dp_replicate", "dp_shard") the state is sharded over dp_shard and equal
// on every replica: replicate row 0 writes optim-<shard>-of-<S> (one copy, as
// the model shards), every rank reads the file of its dp_shard coordinate.
// Otherwise every rank writes and reads optim-<rank>-of-<world>.
struct OptimShard {
  int index = 0;
  int count = 1;
  bool writes = true;
};
OptimShard OptimShardOf(const fsdp::DeviceMesh& m) {
  if (fsdp::IsHsdpMesh(m)) {
    return {static_cast<int>(m.LocalRank(1)), static_cast<int>(m.size(1)), m.LocalRank(0) == 0};
  }
  return {m.global_rank(), static_cast<int>(m.size()), true};
}
// The mesh's replicas: dp_replicate on an HSDP mesh, else 1.
int64_t ReplicasOf(const fsdp::DeviceMesh& m) { return fsdp::IsHsdpMesh(m) ? m.size(0) : 1; }

// The listed files LoadShardedCheckpoint / LoadShardedAdamWState read on
// `rank` when the checkpoint has this run's layout: shards/metadata.json,
// its own model shard, rank 0's (unsharded tensors live there), the model
// shard of replicate row 0 at its dp_shard coordinate (HSDP: the row that
// holds the blocks) and its AdamW file. `all`: every file under shards/ and
// dcp/ (a checkpoint of another layout is read across files).
std::vector<std::string> FilesRankReads(const CheckpointMetadata& meta, int rank, int world, const OptimShard& o,
                                        bool all) {
  const std::string mine = absl::StrCat("/shard-", rank, "-of-", world, ".safetensors");
  const std::string first = absl::StrCat("/shard-0-of-", world, ".safetensors");
  const std::string row0 = absl::StrCat("/shard-", o.index, "-of-", world, ".safetensors");
  const std::string optim = absl::StrCat("/", fsdp::OptimizerShardFileName(o.index, o.count));
  std::vector<std::string> out;
  for (const CheckpointFile& f : meta.files) {
    if (all && absl::StartsWith(f.path, absl::StrCat(kDcpDir, "/"))) out.push_back(f.path);
    if (!absl::StartsWith(f.path, absl::StrCat(kShardsDir, "/"))) continue;
    if (all || f.path == absl::StrCat(kShardsDir, "/metadata.json") || absl::EndsWith(f.path, mine) ||
        absl::EndsWith(f.path, first) || absl::EndsWith(f.path, row0) || absl::EndsWith(f.path, optim)) {
      out.push_back(f.path);
    }
  }
  return out;
}

// Copies `src` into `buf`, reusing buf's tensors when names, shapes and
// dtypes match (the steady state: same tensors every save).
void StageInto(const std::vector<std::pair<std::string, at::Tensor>>& src,
               std::vector<std::pair<std::string, at::Tensor>>* buf) {
  bool reuse = buf->size() == src.size();
  for (size_t i = 0; reuse && i < src.size(); ++i) {
    const at::Tensor& a = (*buf)[i].second;
    const at::Tensor& b = src[i].second;
    reuse = (*buf)[i].first == src[i].first && a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type();
  }
  at::NoGradGuard no_grad;
  if (reuse) {
    for (size_t i = 0; i < src.size(); ++i) (*buf)[i].second.copy_(src[i].second);
    return;
  }
  buf->clear();
  for (const auto& [name, t] : src) buf->emplace_back(name, t.detach().clone(at::MemoryFormat::Contiguous));
}

// The temp dir of save `sequence`: rank 0 begins it and publishes its path.
absl::StatusOr<std::string> ShareTempDir(const CheckpointTarget& t, CheckpointManager* manager, int64_t sequence,
                                         std::optional<PendingCheckpoint>* pending) {
  const std::string key = absl::StrCat("finetune/ckpt_path/", sequence);
  if (t.mesh->global_rank() == 0) {
    absl::StatusOr<PendingCheckpoint> p = manager->BeginWrite();
    if (!p.ok()) return p.status();
    *pending = *p;
    std::error_code ec;
    std::filesystem::create_directories((*pending)->path + "/" + kShardsDir, ec);
    if (!ec && t.dcp_export) std::filesystem::create_directories((*pending)->path + "/" + kDcpDir, ec);
    if (ec) return absl::InternalError(absl::StrCat("mkdir ", (*pending)->path, ": ", ec.message()));
    t.store->set(key, std::vector<uint8_t>((*pending)->path.begin(), (*pending)->path.end()));
  }
  t.store->wait({key}, Ms(t.timeout));
  const std::vector<uint8_t> raw = t.store->get(key);
  return std::string(raw.begin(), raw.end());
}

}  // namespace

absl::Status StartAsyncFineTuneCheckpoint(const CheckpointTarget& t, CheckpointManager* manager,
                                          const TrainerState& state, int64_t sequence,
                                          CheckpointStaging* staging, AsyncCheckpointWriter* writer) {
  const int rank = t.mesh->global_rank();
  std::optional<PendingCheckpoint> pending;
  absl::StatusOr<std::string> dir = ShareTempDir(t, manager, sequence, &pending);
  if (!dir.ok()) return dir.status();
  fsdp::StateDictOptions sd;
  sd.ignore_frozen_params = true;
  absl::StatusOr<fsdp::ShardedCheckpointParts> parts = fsdp::CollectShardedCheckpoint(t.model.ptr(), *t.mesh, sd);
  if (!parts.ok()) return parts.status();
  StageInto(parts->tensors, &staging->model);
  const OptimShard optim = OptimShardOf(*t.mesh);
  if (optim.writes) StageInto(fsdp::CollectAdamWState(t.model.ptr(), *t.optimizer), &staging->optim);
  staging->shards_metadata = parts->metadata_json;
  if (t.dcp_export) {
    absl::Status s = fsdp::SaveDcpCheckpoint(t.model.ptr(), *t.mesh, *dir + "/" + kDcpDir, t.optimizer, sd);
    if (!s.ok()) return s;
  }
  // The gather is a collective: here, not in the background. Its tensors are
  // fresh (gathered) copies, so training may go on while rank 0 writes them.
  absl::StatusOr<fsdp::StateDict> full = fsdp::GetModelStateDict(t.model.ptr(), *t.mesh, sd);
  if (!full.ok()) return full.status();
  auto full_dict = std::make_shared<fsdp::StateDict>(rank == 0 ? std::move(*full) : fsdp::StateDict());
  const int64_t flat_rank = parts->rank, flat_world = parts->world_size;
  auto write = [t, staging, full_dict, state, rank, optim, flat_rank, flat_world, d = *dir]() -> absl::Status {
    const std::string shards = d + "/" + kShardsDir;
    fsdp::ShardedCheckpointParts staged;
    staged.rank = flat_rank;
    staged.world_size = flat_world;
    staged.tensors = staging->model;
    staged.metadata_json = staging->shards_metadata;
    if (absl::Status s = fsdp::WriteShardedParts(staged, shards); !s.ok()) return s;
    if (optim.writes) {
      if (absl::Status s = fsdp::WriteAdamWState(staging->optim, optim.index, optim.count, shards); !s.ok()) return s;
    }
    if (const char* die = std::getenv("TPU_DIST_TEST_ASYNC_CKPT_DIE_RANK");
        die != nullptr && std::atoi(die) == rank && state.epoch == 1) {
      const char* rc = std::getenv("TORCHELASTIC_RESTART_COUNT");
      if (rc == nullptr || std::atoi(rc) == 0) {
        fprintf(stderr, "gemma_finetune: rank %d: TPU_DIST_TEST_ASYNC_CKPT_DIE_RANK: SIGKILL mid-write of epoch %lld's checkpoint\n",
                rank, static_cast<long long>(state.epoch));
        fflush(stderr);
        raise(SIGKILL);
      }
    }
    if (rank != 0) return absl::OkStatus();
    if (absl::Status s = ExportHf(t, *full_dict, d); !s.ok()) return s;
    return WriteText(d + "/" + kTrainerState, TrainerStateToJson(state));
  };
  std::function<absl::StatusOr<std::string>()> commit;
  if (rank == 0) {
    commit = [manager, p = *pending, state, job = t.job]() -> absl::StatusOr<std::string> {
      absl::StatusOr<CheckpointInfo> info = manager->Commit(p, {state.epoch, state.step, state.loss, job});
      if (!info.ok()) return info.status();
      return info->path;
    };
  }
  writer->Start(sequence, std::move(write), std::move(commit));
  return absl::OkStatus();
}

std::string TrainerStateToJson(const TrainerState& s) {
  nlohmann::json j = {{"epoch", s.epoch},           {"step", s.step},
                      {"seed", s.seed},             {"world_size", s.world_size},
                      {"dataset_size", s.dataset_size}, {"loss", s.loss}};
  if (s.dp_replicate != 1) j["dp_replicate"] = s.dp_replicate;  // HSDP only: 1-D files stay as they were
  return j.dump() + "\n";
}

absl::StatusOr<TrainerState> TrainerStateFromJson(const std::string& text, const std::string& where) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    TrainerState s;
    s.epoch = j.at("epoch").get<int64_t>();
    s.step = j.at("step").get<int64_t>();
    s.seed = j.at("seed").get<uint64_t>();
    s.world_size = j.at("world_size").get<int>();
    s.dataset_size = j.at("dataset_size").get<int64_t>();
    s.loss = j.at("loss").is_null() ? NAN : j.at("loss").get<double>();
    s.dp_replicate = j.value("dp_replicate", int64_t{1});
    return s;
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(where, ": bad trainer state: ", ::tpudist::collectives::ExceptionMessage(e)));
  }
}

absl::StatusOr<std::string> SaveFineTuneCheckpoint(const CheckpointTarget& t, CheckpointManager* manager,
                                                   const TrainerState& state, int64_t sequence) {
  const int rank = t.mesh->global_rank();
  const std::string key = absl::StrCat("finetune/ckpt_path/", sequence);
  std::optional<PendingCheckpoint> pending;
  if (rank == 0) {
    absl::StatusOr<PendingCheckpoint> p = manager->BeginWrite();
    if (!p.ok()) return p.status();
    pending = *p;
    std::error_code ec;
    std::filesystem::create_directories(pending->path + "/" + kShardsDir, ec);
    if (!ec && t.dcp_export) std::filesystem::create_directories(pending->path + "/" + kDcpDir, ec);
    if (ec) return absl::InternalError(absl::StrCat("mkdir ", pending->path, ": ", ec.message()));
    t.store->set(key, std::vector<uint8_t>(pending->path.begin(), pending->path.end()));
  }
  t.store->wait({key}, Ms(t.timeout));
  const std::vector<uint8_t> raw = t.store->get(key);
  const std::string dir(raw.begin(), raw.end());
  const std::string shards = dir + "/" + kShardsDir;

  fsdp::StateDictOptions sd;
  sd.ignore_frozen_params = true;
  if (absl::Status s = fsdp::SaveShardedCheckpoint(t.model.ptr(), *t.mesh, shards, sd); !s.ok()) return s;
  if (const OptimShard o = OptimShardOf(*t.mesh); o.writes) {
    absl::Status s = fsdp::SaveShardedAdamWState(t.model.ptr(), *t.optimizer, o.index, o.count, shards);
    if (!s.ok()) return s;
  }
  if (t.dcp_export) {
    absl::Status s = fsdp::SaveDcpCheckpoint(t.model.ptr(), *t.mesh, dir + "/" + kDcpDir, t.optimizer, sd);
    if (!s.ok()) return s;
  }
  absl::StatusOr<fsdp::StateDict> full = fsdp::GetModelStateDict(t.model.ptr(), *t.mesh, sd);
  if (!full.ok()) return full.status();
  if (rank == 0) {
    if (absl::Status s = ExportHf(t, *full, dir); !s.ok()) return s;
    if (absl::Status s = WriteText(dir + "/" + kTrainerState, TrainerStateToJson(state)); !s.ok()) return s;
  }
  if (absl::Status s = Barrier(t); !s.ok()) return s;  // every rank's files are written
  std::string committed;
  if (rank == 0) {
    absl::StatusOr<CheckpointInfo> info =
        manager->Commit(*pending, {state.epoch, state.step, state.loss, t.job});
    if (!info.ok()) return info.status();
    committed = info->path;
  }
  return committed;
}

absl::StatusOr<TrainerState> RestoreFineTuneCheckpoint(const CheckpointTarget& t, const std::string& dir,
                                                       const TrainerState& expect, bool allow_mismatch) {
  const int rank = t.mesh->global_rank();
  const int world = static_cast<int>(t.mesh->size());
  const CheckpointFileReader reader;
  absl::StatusOr<CheckpointMetadata> meta = ReadVerifiedMetadata(reader, dir);
  if (!meta.ok()) return meta.status();
  if (absl::Status s = VerifyCheckpointFiles(dir, *meta, VerifyMode::kChecksums, {kTrainerState}, reader);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> text = reader.ReadFile(absl::StrCat(dir, "/", kTrainerState));
  if (!text.ok()) return text.status();
  absl::StatusOr<TrainerState> state = TrainerStateFromJson(*text, dir);
  if (!state.ok()) return state.status();
  if (state->world_size != expect.world_size ||
      (!allow_mismatch && (state->dataset_size != expect.dataset_size || state->seed != expect.seed))) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": written by a run with world_size ", state->world_size, ", dataset_size ",
        state->dataset_size, ", seed ", state->seed, "; this run has ", expect.world_size, ", ",
        expect.dataset_size, ", ", expect.seed, ": resuming would not continue the same run"));
  }
  // Another slice count (HSDP replicas) at the same world size: the model
  // shards reload onto any layout; the AdamW state is sharded per layout, so
  // it comes from the checkpoint's dcp/ copy (written with --dcp-export),
  // which LoadDcpCheckpoint reads at any layout.
  const int64_t replicas = ReplicasOf(*t.mesh);
  const bool relayout = state->dp_replicate != replicas;
  const std::string dcp = absl::StrCat(dir, "/", kDcpDir);
  if (relayout && !std::filesystem::exists(dcp)) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": written with ", state->dp_replicate, " replica(s) (dp_replicate), this run has ", replicas,
        ": the AdamW state is sharded per layout and the checkpoint has no dcp/ copy to reshard it from "
        "(write checkpoints with --dcp-export to resume on another slice count)"));
  }
  const OptimShard optim = OptimShardOf(*t.mesh);
  if (absl::Status s = VerifyCheckpointFiles(dir, *meta, VerifyMode::kChecksums,
                                             FilesRankReads(*meta, rank, world, optim, relayout), reader);
      !s.ok()) {
    return s;
  }
  const std::string shards = dir + "/" + kShardsDir;
  if (absl::Status s = fsdp::LoadShardedCheckpoint(t.model.ptr(), *t.mesh, shards); !s.ok()) return s;
  if (relayout) {
    if (absl::Status s = fsdp::LoadDcpCheckpoint(t.model.ptr(), *t.mesh, dcp, t.optimizer); !s.ok()) return s;
    return state;
  }
  if (absl::Status s = fsdp::LoadShardedAdamWState(t.model.ptr(), *t.optimizer, optim.index, optim.count, shards);
      !s.ok()) {
    return s;
  }
  return state;
}

}  // namespace tpudist::train
