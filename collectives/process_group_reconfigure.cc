// ProcessGroupTpuDist::Reconfigure and torch's Backend reconfigure API over
// it (issue 33 item 4; torchft re-forms a replica group per quorum).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/exception_message.h"
#include "collectives/process_group_tpu_dist.h"
#include "collectives/work.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace tpudist::collectives {

void ProcessGroupTpuDist::Disconnect(const absl::Status& cause) {
  // Fail the op in flight and the queued ones (each ends within
  // milliseconds: Abort is what abort() does), then join the threads that
  // run them before what they use goes away.
  if (p2p_) p2p_->Abort(cause);
  if (shm_p2p_) shm_p2p_->Abort(cause);
  if (backend_) backend_->Abort(cause);
  worker_.reset();
  p2p_worker_.reset();
  fr_watcher_.reset();  // after the workers: a failing op may ask it to dump
  p2p_.reset();
  shm_p2p_.reset();  // before backend_, whose segments it uses
  backend_.reset();  // unmaps and unlinks the shm segments, closes the mesh
}

void ProcessGroupTpuDist::Reconfigure(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                      int size) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "tpu_dist group '", options_.group_name,
              "': Reconfigure: bad rank ", rank, " for world size ", size);
  TORCH_CHECK(store, "tpu_dist group '", options_.group_name, "': Reconfigure: null store");
  TORCH_CHECK(!(worker_ && worker_->OnWorkerThread()) &&
                  !(p2p_worker_ && p2p_worker_->OnWorkerThread()),
              "tpu_dist group '", options_.group_name,
              "': Reconfigure from one of the group's own op threads (a future callback?)");
  Disconnect(absl::CancelledError(absl::StrCat("tpu_dist group '", options_.group_name,
                                               "' rank ", rank_, ": reconfigured")));
  absl::MutexLock lock(&issue_mu_);
  op_seq_ = 0;
  monitored_barrier_seq_ = 0;
  p2p_counters_.clear();
  p2p_store_.reset();
  fr_failure_dumped_.store(false);
  const bool resized = size != size_;
  rank_ = rank;
  size_ = size;
  if (resized && !options_.global_ranks.empty()) options_.global_ranks.clear();  // stale
  if (recorder_ && resized) {
    MakeFlightRecorder();
  } else if (recorder_) {
    recorder_->set_global_rank(recorder_->group().global_ranks[rank_]);
  }
  disconnected_ = absl::OkStatus();
  try {
    Connect(store);
  } catch (const std::exception& e) {
    disconnected_ = absl::UnavailableError(
        absl::StrCat("tpu_dist group '", options_.group_name, "' rank ", rank, " of ", size,
                     ": Reconfigure failed: ", ExceptionMessage(e)));
    Disconnect(disconnected_);  // whatever Connect made before it failed
    throw;
  }
}

#ifdef C10D_BACKEND_HAS_RECONFIGURE

c10d::ReconfigureHandle ProcessGroupTpuDist::get_reconfigure_handle() const {
  // Unique per group instance of this process; peers only compare handles.
  return absl::StrCat("tpu_dist:", DefaultHostId(options_.host_id), ":", getpid(), ":",
                      reinterpret_cast<uintptr_t>(this));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::reconfigure(
    const c10d::ReconfigureOptions& opts) {
  std::vector<c10d::ReconfigureHandle> handles;
  if (const auto* ordered = std::get_if<std::vector<c10d::ReconfigureHandle>>(&opts.handles)) {
    handles = *ordered;
  } else {
    const auto& set = std::get<std::unordered_set<c10d::ReconfigureHandle>>(opts.handles);
    handles.assign(set.begin(), set.end());
    std::sort(handles.begin(), handles.end());  // the same order on every member
  }
  const c10d::ReconfigureHandle mine = get_reconfigure_handle();
  const auto it = std::find(handles.begin(), handles.end(), mine);
  TORCH_CHECK(it != handles.end(), "tpu_dist group '", options_.group_name,
              "': reconfigure: this instance's handle ", mine, " is not among the ",
              handles.size(), " handles");
  const auto hint = opts.hints.find("store_prefix");
  const std::string prefix =
      hint != opts.hints.end() ? hint->second : absl::StrCat("reconfigure/", opts.uuid);
  if (opts.timeout.has_value()) setTimeout(*opts.timeout);
  Reconfigure(c10::make_intrusive<c10d::PrefixStore>(prefix, base_store_),
              static_cast<int>(it - handles.begin()), static_cast<int>(handles.size()));
  auto work = c10::make_intrusive<TpuDistWork>(rank_, c10d::OpType::UNKNOWN,
                                               std::vector<at::Tensor>{}, timeout());
  work->Finish(absl::OkStatus());
  return work;
}

#endif  // C10D_BACKEND_HAS_RECONFIGURE

}  // namespace tpudist::collectives
