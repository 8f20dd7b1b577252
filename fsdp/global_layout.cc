#include "fsdp/global_layout.h"

#include <map>
#include <mutex>
#include <utility>

#include <c10/util/intrusive_ptr.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tpudist::fsdp {
namespace {

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

struct Record {
  WeakImpl impl;  // keeps the key's memory from being reused while recorded
  GlobalLayout layout;
};

struct Registry {
  std::mutex mu;
  std::map<const c10::TensorImpl*, Record> records;
};

Registry& GetRegistry() {
  static Registry* r = new Registry;  // never destroyed: safe at exit
  return *r;
}

void PruneExpiredLocked(Registry& r) {
  for (auto it = r.records.begin(); it != r.records.end();) {
    it = it->second.impl.expired() ? r.records.erase(it) : std::next(it);
  }
}

}  // namespace

std::string GlobalLayout::ToString() const {
  return absl::StrCat("full [", absl::StrJoin(full_shape, ", "), "] offsets [", absl::StrJoin(offsets, ", "),
                      "] local [", absl::StrJoin(local_shape, ", "), "]");
}

absl::Status SetGlobalLayout(const at::Tensor& param, std::vector<int64_t> full_shape,
                             std::vector<int64_t> offsets) {
  if (!param.defined()) return absl::InvalidArgumentError("SetGlobalLayout: undefined parameter");
  GlobalLayout layout{std::move(full_shape), std::move(offsets), param.sizes().vec()};
  const size_t n = layout.local_shape.size();
  if (layout.full_shape.size() != n || layout.offsets.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("SetGlobalLayout: a ", n, "-dim parameter cannot be ",
                                                   layout.ToString()));
  }
  for (size_t d = 0; d < n; ++d) {
    if (layout.offsets[d] < 0 || layout.offsets[d] + layout.local_shape[d] > layout.full_shape[d]) {
      return absl::InvalidArgumentError(absl::StrCat("SetGlobalLayout: dim ", d, " does not fit: ",
                                                     layout.ToString()));
    }
  }
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  PruneExpiredLocked(r);
  r.records.insert_or_assign(param.unsafeGetTensorImpl(), Record{WeakImpl(param.getIntrusivePtr()), std::move(layout)});
  return absl::OkStatus();
}

std::optional<GlobalLayout> GetGlobalLayout(const at::Tensor& param) {
  if (!param.defined()) return std::nullopt;
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.records.find(param.unsafeGetTensorImpl());
  if (it == r.records.end() || it->second.impl.expired()) return std::nullopt;
  return it->second.layout;
}

void ClearGlobalLayout(const at::Tensor& param) {
  if (!param.defined()) return;
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.records.erase(param.unsafeGetTensorImpl());
}

}  // namespace tpudist::fsdp
