// ProcessGroupTpuDist::monitoredBarrier and getSequenceNumberForGroup.
//
// The monitored barrier goes through the group's store, on the calling
// thread: every rank but 0 sets "mb/<n>/arrived/<rank>" and waits for
// "mb/<n>/release/<rank>"; rank 0 waits for each arrival in rank order
// until the shared deadline, then releases everyone. A rank that does not
// arrive in time is named by rank 0 (all of them with wait_all_ranks); the
// others, never released, fail naming rank 0 as the one to look at.
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/process_group_tpu_dist.h"

namespace tpudist::collectives {
namespace {

// Waits for `key` until `deadline`; false when it is not set by then.
bool WaitKey(c10d::Store& store, const std::string& key,
             std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return store.check({key});
  try {
    store.wait({key}, left);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

void ProcessGroupTpuDist::monitoredBarrier(const c10d::BarrierOptions& opts,
                                           bool wait_all_ranks) {
  int64_t n;
  {
    absl::MutexLock lock(&issue_mu_);
    n = monitored_barrier_seq_++;
  }
  const std::chrono::milliseconds timeout = OpTimeout(opts.timeout);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string base = absl::StrCat("mb/", n, "/");
  if (rank_ != 0) {
    store_->set(absl::StrCat(base, "arrived/", rank_), std::vector<uint8_t>{1});
    TORCH_CHECK(WaitKey(*store_, absl::StrCat(base, "release/", rank_), deadline), "Rank ",
                rank_, " successfully reached monitoredBarrier, but received errors while "
                "waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank "
                "(tpu_dist, timeout ", timeout.count(), " ms).");
    return;
  }
  TORCH_CHECK(timeout.count() > 0 || size_ == 1, "Rank 0 timed out in monitoredBarrier after ",
              timeout.count(), " ms.");
  std::vector<int> failed;
  for (int r = 1; r < size_; ++r) {
    if (WaitKey(*store_, absl::StrCat(base, "arrived/", r), deadline)) continue;
    failed.push_back(r);
    if (!wait_all_ranks) break;
  }
  // One rank: "Rank r ..."; with wait_all_ranks every missing one: "Ranks a, b ...".
  TORCH_CHECK(failed.empty(), wait_all_ranks ? "Ranks " : "Rank ", absl::StrJoin(failed, ", "),
              " failed to pass monitoredBarrier in ", timeout.count(), " ms (tpu_dist)");
  for (int r = 1; r < size_; ++r) store_->set(absl::StrCat(base, "release/", r), std::vector<uint8_t>{1});
}

uint64_t ProcessGroupTpuDist::getSequenceNumberForGroup() {
  absl::MutexLock lock(&issue_mu_);
  return op_seq_;
}

}  // namespace tpudist::collectives
