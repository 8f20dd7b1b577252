// FsdpParamGroup: the parameters of one FullyShard call, sharded Shard(0)
// over a 1-D DeviceMesh, or HSDP over a 2-D mesh whose dims are named
// ("dp_replicate", "dp_shard") (sharded over dp_shard, replicated over
// dp_replicate; torch FSDP2's 2-D mesh), with the group's collectives:
//
//   unshard  pack this rank's padded shards (cast to param_dtype) into one
//            flat buffer, ONE _allgather_base, split into full tensors and
//            param.set_data(full)            (StartUnshard / WaitUnshard)
//   reshard  param.set_data(shard)           (Reshard)
//   reduce   after backward: pack the full grads (cast to reduce_dtype) into
//            one padded flat buffer, ONE _reduce_scatter_base(AVG), and set
//            param.grad = this rank's shard in the master dtype
//            (OnGradReady -> ReduceGrads -> FinishReduceGrads); with HSDP
//            the reduce-scatter runs over dp_shard and its output (still in
//            reduce_dtype) is then all-reduced AVG over dp_replicate before
//            the cast: the grad is sum / (shard * replicate), as torch's
//            foreach_reduce does for fp32/bf16 (RS AVG, then AR AVG)
//
// Every parameter keeps its TensorImpl (module members alias it); only its
// data moves between the sharded view (a narrow of the group's padded fp32
// flat shard, so an optimizer stepping on the parameter updates the buffer
// the next all-gather reads) and a full tensor in param_dtype.
//
// Gradient readiness: after each unshard with grad mode on, a post-hook is
// attached to every trainable parameter's AccumulateGrad node; when all of
// them ran in a backward, the group reduces (or, with gradient sync off,
// accumulates the full grads in reduce_dtype for a later reduce).
//
// Thread-safety: one thread per rank (the training thread, which also runs
// CPU backward). All ranks must drive their groups in the same order.
#ifndef TPU_DIST_FSDP_FULLY_SHARD_FSDP_PARAM_GROUP_H_
#define TPU_DIST_FSDP_FULLY_SHARD_FSDP_PARAM_GROUP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "fsdp/device_mesh.h"
#include "fsdp/dtensor.h"
#include "fsdp/fully_shard/flat_param_math.h"

namespace tpudist::fsdp {

// FSDP2's MixedPrecisionPolicy. nullopt means "the parameter's own dtype"
// (param_dtype) and "param_dtype" (reduce_dtype). Master shards and the
// optimizer always stay in the parameter's original dtype.
struct MixedPrecisionPolicy {
  std::optional<at::ScalarType> param_dtype;
  std::optional<at::ScalarType> reduce_dtype;
  bool cast_forward_inputs = true;  // cast floating inputs to param_dtype
};

class FsdpParamGroup : public std::enable_shared_from_this<FsdpParamGroup> {
 public:
  enum class State { kSharded, kGathering, kUnsharded };

  // Shards `params` (name relative to the FullyShard-ed module, tensor) in
  // place: each parameter's data becomes this rank's shard. InvalidArgument
  // for 0-dim, non-float or non-contiguous parameters, or mixed dtypes.
  static absl::StatusOr<std::shared_ptr<FsdpParamGroup>> Create(
      std::string label, std::vector<std::pair<std::string, at::Tensor>> params,
      const DeviceMesh& mesh, const MixedPrecisionPolicy& mp);

  const std::string& label() const { return label_; }
  State state() const { return state_; }
  size_t size() const { return params_.size(); }
  const std::string& name(size_t i) const { return params_[i].name; }
  const at::Tensor& param(size_t i) const { return params_[i].param; }
  const FlatParamLayout& layout() const { return layout_; }
  const DeviceMesh& mesh() const { return mesh_; }
  // Index along the shard dim (the mesh's last) and its size; the flat
  // layout's world_size is the shard size.
  int64_t rank() const { return rank_; }
  int64_t shard_world() const { return world_; }
  // HSDP: the replicate dim's size (1 on a 1-D mesh).
  int64_t replicate_world() const { return replicate_world_; }
  // This rank's shard of parameter i: [ShardShape(i)] (a view of the flat
  // shard), and the same as a DTensor Shard(0) with the global shape
  // ((Replicate, Shard(0)) on an HSDP mesh).
  const at::Tensor& shard(size_t i) const { return params_[i].shard; }
  absl::StatusOr<DTensor> ShardedParam(size_t i) const;

  // Master (original dtype) full parameters, by one blocking all-gather of
  // the flat shards. Collective. Returns full[i]: [entries[i].shape].
  absl::StatusOr<std::vector<at::Tensor>> GatherFullMaster();
  // Overwrites this rank's shards with its rows of full[i] ([entries[i]
  // .shape]; undefined = keep). FailedPrecondition unless kSharded.
  absl::Status SetShardsFromFull(absl::Span<const at::Tensor> full);

  // Issues the all-gather (no-op unless kSharded). Then kGathering.
  // `waits_now`: the caller waits for it at once (WaitUnshard), so the
  // backend may run a small one on this thread (c10d asyncOp = false); a
  // prefetch (false) always overlaps on the backend's worker.
  absl::Status StartUnshard(bool waits_now = false);
  // Completes the all-gather (issuing it first if needed) and installs the
  // full parameters. No-op when kUnsharded.
  absl::Status WaitUnshard();
  // Back to shards (waits out a pending all-gather first).
  absl::Status Reshard();

  // Backward protocol, driven by FullyShard's hooks.
  void BeginBackward();  // stashes existing shard grads; idempotent per backward
  bool backward_started() const { return backward_started_; }
  bool grads_reduced() const { return grads_reduced_; }
  int num_trainable() const { return num_trainable_; }
  // Collects the full grads present now (missing ones count as zeros);
  // with sync on issues the reduce-scatter, with sync off accumulates them.
  // Then reshards.
  absl::Status ReduceGrads();
  // Waits the reduce-scatter and writes param.grad (= stash + new shard).
  absl::Status FinishReduceGrads();
  void EndBackward();

  void set_requires_gradient_sync(bool sync) { requires_gradient_sync_ = sync; }
  bool requires_gradient_sync() const { return requires_gradient_sync_; }

  // Accounting for tests and the memory model.
  int64_t num_all_gathers() const { return num_all_gathers_; }
  int64_t num_reduce_scatters() const { return num_reduce_scatters_; }
  int64_t num_all_reduces() const { return num_all_reduces_; }  // HSDP only
  int64_t full_param_bytes() const;  // all full params in param_dtype
  int64_t gathered_bytes() const {   // the padded all-gather output
    return world_ * layout_.shard_numel * static_cast<int64_t>(c10::elementSize(param_dtype_));
  }
  int64_t shard_bytes() const { return flat_shard_.nbytes(); }
  // Called with the change in bytes of unsharded storage alive: the
  // all-gather output from issue, then the full params until reshard.
  void set_memory_observer(std::function<void(int64_t)> f) { memory_observer_ = std::move(f); }
  // Called with an event name ("all_gather_issued", ...).
  void set_trace(std::function<void(const std::string&)> f) { trace_ = std::move(f); }
  // Phase timing (off unless `enabled` returns true; no clock is read then):
  // `record(phase, wall_s, thread_cpu_s)` after each of "unshard_issue"
  // (cast + issue the all-gather), "all_gather_wait", "unpack" (copy into
  // the full params), "reduce_issue" (pack the grads + issue the
  // reduce-scatter), "reduce_scatter_wait", "all_reduce_wait" (HSDP: issue
  // and wait the all-reduce over dp_replicate) and "reduce_finish".
  void set_phase_timer(std::function<bool()> enabled,
                       std::function<void(const char*, double, double)> record) {
    timer_enabled_ = std::move(enabled);
    timer_record_ = std::move(record);
  }

  // Called by the AccumulateGrad post-hook of parameter i.
  void OnGradReady(size_t i);

 private:
  struct Param {
    std::string name;
    at::Tensor param;         // the registered leaf; data = shard or full
    at::Tensor shard;         // [ShardShape] view into flat_shard_
    bool trainable = false;
    c10::intrusive_ptr<torch::autograd::Node> grad_acc;  // hooked AccumulateGrad
    bool grad_ready = false;
    at::Tensor stashed_grad;   // [ShardShape] grad from before this backward
    at::Tensor accumulated;    // [global shape] reduce_dtype, sync off
  };
  class PhaseScope;  // times one phase for timer_record_ (fsdp_param_group.cc)
  FsdpParamGroup(std::string label, const DeviceMesh& mesh, const MixedPrecisionPolicy& mp);
  absl::Status WaitWork(const c10::intrusive_ptr<c10d::Work>& work, const char* op);
  void HookGradAccumulators();
  void Trace(const std::string& event) const {
    if (trace_) trace_(label_ + ":" + event);
  }

  std::string label_;
  DeviceMesh mesh_;
  int64_t rank_ = 0;
  int64_t world_ = 1;  // shard dim size
  c10::intrusive_ptr<c10d::ProcessGroup> shard_group_;
  c10::intrusive_ptr<c10d::ProcessGroup> replicate_group_;  // HSDP only
  int64_t replicate_world_ = 1;
  at::ScalarType orig_dtype_ = at::kFloat;
  at::ScalarType param_dtype_ = at::kFloat;
  at::ScalarType reduce_dtype_ = at::kFloat;
  std::vector<Param> params_;
  FlatParamLayout layout_;
  at::Tensor flat_shard_;  // [shard_numel] orig dtype, padded master shards
  State state_ = State::kSharded;
  int num_trainable_ = 0;

  c10::intrusive_ptr<c10d::Work> gather_work_;
  at::Tensor gather_in_;   // [shard_numel] param_dtype
  at::Tensor gather_out_;  // [W * shard_numel] param_dtype
  c10::intrusive_ptr<c10d::Work> reduce_work_;
  at::Tensor reduce_in_;   // [W * shard_numel] reduce_dtype
  at::Tensor reduce_out_;  // [shard_numel] reduce_dtype

  bool backward_started_ = false;
  bool grads_reduced_ = false;
  int ready_count_ = 0;
  bool requires_gradient_sync_ = true;
  int64_t num_all_gathers_ = 0;
  int64_t num_reduce_scatters_ = 0;
  int64_t num_all_reduces_ = 0;
  std::function<void(int64_t)> memory_observer_;
  std::function<void(const std::string&)> trace_;
  std::function<bool()> timer_enabled_;
  std::function<void(const char*, double, double)> timer_record_;
};

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_FULLY_SHARD_FSDP_PARAM_GROUP_H_
