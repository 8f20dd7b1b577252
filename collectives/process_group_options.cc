// The group's options as c10d sees them: getBackendOptions (torch's
// `Backend.options`), setTimeout (torch.distributed.set_timeout) and split
// (torch.distributed.split_group), which makes a child group from the
// parent's options.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/process_group_tpu_dist.h"

namespace tpudist::collectives {

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupTpuDist::getBackendOptions() {
  auto opts = c10::make_intrusive<BackendOptions>();
  opts->tpu_dist = options_;
  opts->tpu_dist.timeout = timeout();
  opts->timeout = timeout();
  opts->group_name = options_.group_name;
  return opts;
}

void ProcessGroupTpuDist::setTimeout(std::chrono::milliseconds timeout) {
  TORCH_CHECK(timeout.count() > 0, "tpu_dist: setTimeout: the timeout must be positive, got ",
              timeout.count(), " ms");
  timeout_ms_.store(timeout.count(), std::memory_order_relaxed);
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupTpuDist::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) return nullptr;  // torch: not a member of any split
  for (int r : ranks) {
    TORCH_CHECK(r >= 0 && r < size_, "tpu_dist: split: rank ", r, " of [",
                absl::StrJoin(ranks, ","), "] is not in the parent group of ", size_);
  }
  Options child = options_;
  child.timeout = timeout();
  if (opts) {
    if (const auto* ours = dynamic_cast<const BackendOptions*>(opts.get())) {
      child = ours->tpu_dist;
    }
    TORCH_CHECK(opts->timeout.count() > 0, "tpu_dist: split: the timeout must be positive, got ",
                opts->timeout.count(), " ms");
    child.timeout = opts->timeout;
    if (!opts->group_name.empty()) child.group_name = opts->group_name;
  }
  if (child.group_name == options_.group_name) {
    child.group_name = absl::StrCat(options_.group_name, "_split_", absl::StrJoin(ranks, "_"));
  }
  // The child's global ranks (flight-recorder dumps name them): torch's, or
  // mapped through this group's.
  child.global_ranks.clear();
  if (opts && opts->global_ranks_in_group.size() == ranks.size()) {
    child.global_ranks.assign(opts->global_ranks_in_group.begin(),
                              opts->global_ranks_in_group.end());
  } else {
    for (int r : ranks) {
      child.global_ranks.push_back(static_cast<int>(options_.global_ranks.size()) == size_
                                       ? options_.global_ranks[r]
                                       : r);
    }
  }
  return c10::make_intrusive<ProcessGroupTpuDist>(
      store, static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()),
      std::move(child));
}

}  // namespace tpudist::collectives
