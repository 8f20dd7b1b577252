#include "fsdp/fully_shard/mesh_agreement.h"

#include <cstring>

#include <algorithm>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "absl/strings/str_cat.h"
#include "collectives/exception_message.h"

namespace tpudist::fsdp {

absl::Status AgreeOnStatus(const DeviceMesh& mesh, const absl::Status& mine, absl::string_view what) {
  std::vector<at::Tensor> v = {at::full({1}, mine.ok() ? 1 : 0, at::kInt)};  // [1]
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MIN;
  o.asyncOp = false;  // waited on at once
  try {
    for (int d = 0; d < mesh.ndim(); ++d) {
      if (!mesh.Group(d)->allreduce(v, o)->wait(mesh.collective_timeout_ms())) {
        return absl::DeadlineExceededError(absl::StrCat(what, ": barrier timed out"));
      }
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": barrier failed: ", ::tpudist::collectives::ExceptionMessage(e)));
  }
  if (!mine.ok()) return mine;
  if (v[0].item<int>() == 0) return absl::AbortedError(absl::StrCat(what, ": failed on another rank"));
  return absl::OkStatus();
}

int64_t MeshFlatRank(const DeviceMesh& mesh) {
  int64_t r = 0;
  for (int d = 0; d < mesh.ndim(); ++d) r = r * mesh.size(d) + mesh.LocalRank(d);
  return r;
}

absl::StatusOr<std::vector<nlohmann::json>> AllGatherJson(const DeviceMesh& mesh, const nlohmann::json& mine,
                                                          absl::string_view what) {
  std::vector<nlohmann::json> list = {mine};
  c10d::AllgatherOptions o;
  o.asyncOp = false;  // waited on at once
  try {
    for (int d = mesh.ndim() - 1; d >= 0; --d) {
      const int64_t n = mesh.size(d);
      const std::string packed = nlohmann::json(list).dump();
      std::vector<at::Tensor> len = {at::full({1}, static_cast<int64_t>(packed.size()), at::kLong)};  // [1]
      std::vector<std::vector<at::Tensor>> lens(1);
      for (int64_t i = 0; i < n; ++i) lens[0].push_back(at::zeros({1}, at::kLong));  // [1] each
      if (!mesh.Group(d)->allgather(lens, len, o)->wait(mesh.collective_timeout_ms())) {
        return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
      }
      int64_t longest = 1;
      for (const at::Tensor& l : lens[0]) longest = std::max(longest, l.item<int64_t>());
      std::vector<at::Tensor> bytes = {at::zeros({longest}, at::kByte)};  // [longest]
      std::memcpy(bytes[0].data_ptr(), packed.data(), packed.size());
      std::vector<std::vector<at::Tensor>> all(1);
      for (int64_t i = 0; i < n; ++i) all[0].push_back(at::zeros({longest}, at::kByte));  // [longest] each
      if (!mesh.Group(d)->allgather(all, bytes, o)->wait(mesh.collective_timeout_ms())) {
        return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
      }
      list.clear();
      for (int64_t i = 0; i < n; ++i) {
        const char* p = static_cast<const char*>(all[0][i].data_ptr());
        nlohmann::json part = nlohmann::json::parse(p, p + lens[0][i].item<int64_t>(), nullptr, false);
        if (part.is_discarded() || !part.is_array()) {
          return absl::DataLossError(absl::StrCat(what, ": a gathered value does not parse"));
        }
        for (auto& j : part) list.push_back(std::move(j));
      }
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": failed: ",
                                            ::tpudist::collectives::ExceptionMessage(e)));
  }
  return list;
}

}  // namespace tpudist::fsdp
