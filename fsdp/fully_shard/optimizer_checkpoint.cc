#include "fsdp/fully_shard/optimizer_checkpoint.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "io/safetensors.h"

namespace tpudist::fsdp {
namespace {

// torch 2.x keys optimizer state by the parameter's TensorImpl address.
void* StateKey(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }

}  // namespace

std::string OptimizerShardFileName(int rank, int world_size) {
  return absl::StrCat("optim-", rank, "-of-", world_size, ".safetensors");
}

std::vector<std::pair<std::string, at::Tensor>> CollectAdamWState(const std::shared_ptr<torch::nn::Module>& model,
                                                                  torch::optim::AdamW& optimizer) {
  auto& state = optimizer.state();
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    auto it = state.find(StateKey(item.value()));
    if (it == state.end()) continue;
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    tensors.emplace_back(item.key() + ".exp_avg", s.exp_avg());
    tensors.emplace_back(item.key() + ".exp_avg_sq", s.exp_avg_sq());
    if (s.max_exp_avg_sq().defined()) tensors.emplace_back(item.key() + ".max_exp_avg_sq", s.max_exp_avg_sq());
    tensors.emplace_back(item.key() + ".step", at::full({1}, s.step(), at::kLong));
  }
  return tensors;
}

absl::Status WriteAdamWState(const std::vector<std::pair<std::string, at::Tensor>>& tensors, int rank,
                             int world_size, const std::string& dir) {
  return io::WriteSafetensors(absl::StrCat(dir, "/", OptimizerShardFileName(rank, world_size)), tensors,
                              {{"world_size", absl::StrCat(world_size)}, {"rank", absl::StrCat(rank)}});
}

absl::Status SaveShardedAdamWState(const std::shared_ptr<torch::nn::Module>& model,
                                   torch::optim::AdamW& optimizer, int rank, int world_size,
                                   const std::string& dir) {
  return WriteAdamWState(CollectAdamWState(model, optimizer), rank, world_size, dir);
}

absl::Status LoadShardedAdamWState(const std::shared_ptr<torch::nn::Module>& model,
                                   torch::optim::AdamW& optimizer, int rank, int world_size,
                                   const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", OptimizerShardFileName(rank, world_size));
  absl::StatusOr<io::SafetensorsContents> file = io::ReadSafetensors(path);
  if (!file.ok()) {
    // A file for another world size means the job was resized.
    return absl::Status(file.status().code(),
                        absl::StrCat("optimizer state for rank ", rank, " of ", world_size, ": ",
                                     file.status().message(),
                                     " (resharding optimizer state to a new world size is not supported)"));
  }
  int saved_world = -1;
  auto w = file->metadata.find("world_size");
  if (w == file->metadata.end() || !absl::SimpleAtoi(w->second, &saved_world) || saved_world != world_size) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": saved with world_size ",
                                                      w == file->metadata.end() ? "?" : w->second,
                                                      ", loading with ", world_size));
  }
  const auto& t = file->tensors;
  auto& state = optimizer.state();
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    auto avg = t.find(item.key() + ".exp_avg");
    if (avg == t.end()) continue;
    auto sq = t.find(item.key() + ".exp_avg_sq");
    auto step = t.find(item.key() + ".step");
    if (sq == t.end() || step == t.end()) {
      return absl::DataLossError(absl::StrCat(path, ": incomplete state for ", item.key()));
    }
    if (avg->second.sizes() != p.sizes() || sq->second.sizes() != p.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", item.key(), " state shape ",
                                                     c10::str(avg->second.sizes()), " vs parameter shard ",
                                                     c10::str(p.sizes())));
    }
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(step->second.item<int64_t>());
    s->exp_avg(avg->second.to(p.scalar_type()).clone());
    s->exp_avg_sq(sq->second.to(p.scalar_type()).clone());
    auto mx = t.find(item.key() + ".max_exp_avg_sq");
    if (mx != t.end()) s->max_exp_avg_sq(mx->second.to(p.scalar_type()).clone());
    state[StateKey(p)] = std::move(s);
  }
  return absl::OkStatus();
}

}  // namespace tpudist::fsdp
