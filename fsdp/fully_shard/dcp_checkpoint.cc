#include "fsdp/fully_shard/dcp_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <system_error>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "fsdp/fully_shard/dcp_layout.h"
#include "fsdp/fully_shard/internal/local_blocks.h"
#include "fsdp/fully_shard/mesh_agreement.h"
#include "io/safetensors.h"

namespace tpudist::fsdp {
namespace {

using internal::LocalTensor;

// The *.safetensors files directly in `dir`, sorted. NotFound when `dir`
// cannot be listed.
absl::StatusOr<std::vector<std::string>> SafetensorsFilesIn(const std::string& dir, absl::string_view what) {
  std::error_code ec;
  std::vector<std::string> out;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;  // the throwing overload would escape as an exception
    if (absl::EndsWith(name, ".safetensors") && it->is_regular_file(type_ec)) out.push_back(it->path().string());
  }
  if (ec) return absl::NotFoundError(absl::StrCat(what, ": cannot list ", dir, ": ", ec.message()));
  std::sort(out.begin(), out.end());
  return out;
}

// torch's AdamW keeps per-parameter state under the parameter's TensorImpl.
void* StateKey(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }

const torch::optim::AdamWParamState* AdamWStateOf(torch::optim::AdamW& optimizer, const at::Tensor& p) {
  auto it = optimizer.state().find(StateKey(p));
  if (it == optimizer.state().end()) return nullptr;
  return static_cast<const torch::optim::AdamWParamState*>(it->second.get());
}

absl::Status WriteDcpShards(const std::shared_ptr<torch::nn::Module>& model, const DeviceMesh& mesh,
                            const std::string& dir, torch::optim::AdamW* optimizer,
                            const StateDictOptions& options) {
  constexpr absl::string_view kWhat = "SaveDcpCheckpoint";
  const int64_t rank = MeshFlatRank(mesh);
  absl::Status mine_ok = absl::OkStatus();
  absl::StatusOr<std::vector<std::string>> existing = SafetensorsFilesIn(dir, kWhat);
  if (!existing.ok()) {
    mine_ok = existing.status();
  } else if (!existing->empty()) {
    mine_ok = absl::FailedPreconditionError(absl::StrCat(
        kWhat, ": ", dir, " already holds ", (*existing)[0],
        " (torch's HuggingFaceStorageReader reads every *.safetensors there): save into an empty directory"));
  }
  absl::StatusOr<std::vector<LocalTensor>> local = internal::CollectLocalTensors(model, rank, options, kWhat);
  if (mine_ok.ok() && !local.ok()) mine_ok = local.status();
  // Every rank takes part in the gather, even one that already failed; it
  // also orders every rank's directory check before any rank's write.
  const nlohmann::json mine = mine_ok.ok() ? internal::DescribeLocalTensors(*local) : nlohmann::json::array();
  absl::StatusOr<std::vector<nlohmann::json>> all =
      AllGatherJson(mesh, mine, "SaveDcpCheckpoint: gathering block descriptions");
  if (!mine_ok.ok()) return mine_ok;
  if (!all.ok()) return all.status();
  absl::StatusOr<ShardedCheckpointMetadata> merged = internal::MergeBlocks(*all, rank, *local, kWhat);
  if (!merged.ok()) return merged.status();

  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::vector<std::pair<std::string, std::vector<int64_t>>> offsets;
  auto add = [&](std::string key, at::Tensor t, const std::vector<int64_t>& o) {  // t: [block sizes]
    offsets.emplace_back(key, o);
    tensors.emplace_back(std::move(key), std::move(t));
  };
  for (const LocalTensor& t : *local) {
    if (!t.data.defined()) continue;
    add(t.name, t.data, t.block.offsets);
    if (optimizer == nullptr || !t.param.defined()) continue;
    const torch::optim::AdamWParamState* s = AdamWStateOf(*optimizer, t.param);
    if (s == nullptr) continue;
    const std::string prefix = absl::StrCat(kDcpOptimizerStatePrefix, t.name, ".");
    if (s->exp_avg().sizes() != t.data.sizes()) {
      return absl::FailedPreconditionError(absl::StrCat(kWhat, ": AdamW state of ", t.name, " has shape ",
                                                        c10::str(s->exp_avg().sizes()), ", its shard ",
                                                        c10::str(t.data.sizes())));
    }
    add(prefix + "exp_avg", s->exp_avg(), t.block.offsets);
    add(prefix + "exp_avg_sq", s->exp_avg_sq(), t.block.offsets);
    if (s->max_exp_avg_sq().defined()) add(prefix + "max_exp_avg_sq", s->max_exp_avg_sq(), t.block.offsets);
    const bool origin = std::all_of(t.block.offsets.begin(), t.block.offsets.end(), [](int64_t o) { return o == 0; });
    // torch keeps step as a 0-d float32 tensor, one per parameter.
    if (origin) add(prefix + "step", at::scalar_tensor(static_cast<double>(s->step()), at::kFloat), {});
  }
  if (tensors.empty()) return absl::OkStatus();  // as torch: no items, no file
  return io::WriteSafetensors(absl::StrCat(dir, "/", DcpShardFileName(rank)), tensors, DcpFileMetadata(offsets));
}

// The open files of a checkpoint and their index.
struct DcpCheckpoint {
  std::vector<std::shared_ptr<const io::SafetensorsFile>> files;
  std::map<std::string, DcpTensorIndex> index;
};

absl::StatusOr<DcpCheckpoint> OpenDcpCheckpoint(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> paths = SafetensorsFilesIn(dir, "LoadDcpCheckpoint");
  if (!paths.ok()) return paths.status();
  if (paths->empty()) {
    std::error_code ec;
    const bool default_layout = std::filesystem::exists(dir + "/.metadata", ec);
    return absl::NotFoundError(absl::StrCat(
        "LoadDcpCheckpoint: no *.safetensors file in ", dir,
        default_layout ? " (it holds DCP's default FileSystemWriter layout, .metadata + .distcp, which is not "
                         "read: save with torch.distributed.checkpoint.HuggingFaceStorageWriter(path, "
                         "save_distributed=True))"
                       : ""));
  }
  DcpCheckpoint ckpt;
  std::vector<DcpFileView> views;
  for (const std::string& path : *paths) {
    absl::StatusOr<std::shared_ptr<const io::SafetensorsFile>> f = io::SafetensorsFile::Open(path);
    if (!f.ok()) return f.status();
    views.push_back(DcpFileView{path, (*f)->entries(), (*f)->metadata()});
    ckpt.files.push_back(*std::move(f));
  }
  absl::StatusOr<std::map<std::string, DcpTensorIndex>> index = BuildDcpIndex(views);
  if (!index.ok()) return index.status();
  ckpt.index = *std::move(index);
  return ckpt;
}

// Copies into dst (this rank's block `mine` of key's full tensor) every
// saved chunk's overlap with it. dst: [mine.sizes].
absl::Status CopyBlock(const DcpCheckpoint& ckpt, const DcpTensorIndex& t, const std::string& key,
                       const Block& mine, at::Tensor dst) {
  for (const DcpChunk& c : t.chunks) {
    const Block both = IntersectBlocks(mine, c.block);
    if (both.numel() == 0) continue;
    absl::StatusOr<at::Tensor> piece = ckpt.files[c.file]->Get(key);  // [c.block.sizes]
    if (!piece.ok()) return piece.status();
    internal::NarrowToBlock(dst, internal::RelativeBlock(both, mine.offsets))
        .copy_(internal::NarrowToBlock(*piece, internal::RelativeBlock(both, c.block.offsets)));
  }
  return absl::OkStatus();
}

absl::Status CheckShape(const std::string& dir, const std::string& key, const DcpTensorIndex& t,
                        const std::vector<int64_t>& want) {
  if (t.shape == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("LoadDcpCheckpoint: ", key, " has shape ",
                                                 c10::str(at::IntArrayRef(t.shape)), " in ", dir,
                                                 ", the model has ", c10::str(at::IntArrayRef(want))));
}

// The AdamW state of parameter `name` (this rank's block `target.mine`).
absl::StatusOr<std::unique_ptr<torch::optim::AdamWParamState>> ReadAdamWState(
    const DcpCheckpoint& ckpt, const std::string& dir, const std::string& name, const at::Tensor& p,
    const internal::LoadTarget& target) {
  const std::string prefix = absl::StrCat(kDcpOptimizerStatePrefix, name, ".");
  auto state = std::make_unique<torch::optim::AdamWParamState>();
  for (const char* which : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}) {
    const std::string key = prefix + which;
    auto it = ckpt.index.find(key);
    if (it == ckpt.index.end()) {
      if (std::string(which) == "max_exp_avg_sq") continue;
      return absl::NotFoundError(absl::StrCat("LoadDcpCheckpoint: ", dir, " has no ", key,
                                              " (saved without optimizer state, or before the first step?)"));
    }
    absl::Status s = CheckShape(dir, key, it->second, target.full_shape);
    if (!s.ok()) return s;
    at::Tensor dst = at::empty(p.sizes(), p.options());  // [mine.sizes]: the parameter's shard
    s = CopyBlock(ckpt, it->second, key, target.mine, dst);
    if (!s.ok()) return s;
    if (std::string(which) == "exp_avg") state->exp_avg(dst);
    if (std::string(which) == "exp_avg_sq") state->exp_avg_sq(dst);
    if (std::string(which) == "max_exp_avg_sq") state->max_exp_avg_sq(dst);
  }
  const std::string key = prefix + "step";
  auto it = ckpt.index.find(key);
  if (it == ckpt.index.end()) return absl::NotFoundError(absl::StrCat("LoadDcpCheckpoint: ", dir, " has no ", key));
  if (!it->second.shape.empty() && WholeBlock(it->second.shape).numel() != 1) {
    return absl::DataLossError(absl::StrCat("LoadDcpCheckpoint: ", key, " in ", dir, " has shape ",
                                            c10::str(at::IntArrayRef(it->second.shape)), ", not one number"));
  }
  absl::StatusOr<at::Tensor> step = ckpt.files[it->second.chunks[0].file]->Get(key);
  if (!step.ok()) return step.status();
  const double v = step->to(at::kDouble).item<double>();
  if (!(v >= 0) || v != std::floor(v) || v > 9.0e15) {
    return absl::DataLossError(absl::StrCat("LoadDcpCheckpoint: ", key, " in ", dir, " is ", v,
                                            ", not a step count"));
  }
  state->step(static_cast<int64_t>(v));
  return state;
}

absl::Status ReadDcp(const std::shared_ptr<torch::nn::Module>& model, const std::string& dir,
                     torch::optim::AdamW* optimizer) {
  absl::StatusOr<DcpCheckpoint> ckpt = OpenDcpCheckpoint(dir);
  if (!ckpt.ok()) return ckpt.status();
  const FsdpGroupIndex index = IndexFsdpGroups(model);
  at::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> targets;  // (name, parameter or buffer)
  for (const auto& item : model->named_parameters(true)) targets.emplace_back(item.key(), item.value());
  const size_t num_params = targets.size();
  for (const auto& item : model->named_buffers(true)) targets.emplace_back(item.key(), item.value());
  std::vector<std::pair<void*, std::unique_ptr<torch::optim::AdamWParamState>>> states;
  for (size_t i = 0; i < targets.size(); ++i) {
    const auto& [name, t] = targets[i];
    const bool trainable = i < num_params && t.requires_grad();
    auto m = ckpt->index.find(name);
    if (m == ckpt->index.end()) {
      if (!trainable) continue;  // frozen parameters and buffers may be left out
      return absl::NotFoundError(absl::StrCat("LoadDcpCheckpoint: ", dir, " has no ", name));
    }
    absl::StatusOr<internal::LoadTarget> target = internal::TargetOf(index, t, name);
    if (!target.ok()) return target.status();
    absl::Status s = CheckShape(dir, name, m->second, target->full_shape);
    if (!s.ok()) return s;
    s = CopyBlock(*ckpt, m->second, name, target->mine, target->dst);
    if (!s.ok()) return s;
    if (optimizer != nullptr && trainable) {
      absl::StatusOr<std::unique_ptr<torch::optim::AdamWParamState>> st = ReadAdamWState(*ckpt, dir, name, t, *target);
      if (!st.ok()) return st.status();
      states.emplace_back(StateKey(t), *std::move(st));
    }
  }
  // Only a complete read replaces the optimizer's state.
  for (auto& [key, st] : states) optimizer->state()[key] = std::move(st);
  return absl::OkStatus();
}

}  // namespace

absl::Status SaveDcpCheckpoint(const std::shared_ptr<torch::nn::Module>& model, const DeviceMesh& mesh,
                               const std::string& dir, torch::optim::AdamW* optimizer,
                               const StateDictOptions& options) {
  return AgreeOnStatus(mesh, WriteDcpShards(model, mesh, dir, optimizer, options), "SaveDcpCheckpoint");
}

absl::Status LoadDcpCheckpoint(const std::shared_ptr<torch::nn::Module>& model, const DeviceMesh& mesh,
                               const std::string& dir, torch::optim::AdamW* optimizer) {
  return AgreeOnStatus(mesh, ReadDcp(model, dir, optimizer), "LoadDcpCheckpoint");
}

absl::StatusOr<bool> DcpCheckpointHasOptimizerState(const std::string& dir) {
  absl::StatusOr<DcpCheckpoint> ckpt = OpenDcpCheckpoint(dir);
  if (!ckpt.ok()) return ckpt.status();
  auto it = ckpt->index.lower_bound(kDcpOptimizerStatePrefix);
  return it != ckpt->index.end() && absl::StartsWith(it->first, kDcpOptimizerStatePrefix);
}

}  // namespace tpudist::fsdp
