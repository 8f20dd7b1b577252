#include "fsdp/fully_shard/fsdp_param_group.h"

#include <time.h>

#include <chrono>
#include <exception>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include "absl/strings/str_cat.h"
#include "collectives/exception_message.h"
#include "fsdp/fully_shard/flat_buffer.h"

namespace tpudist::fsdp {
namespace {

// Tells the group that parameter `index`'s AccumulateGrad has run.
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(std::weak_ptr<FsdpParamGroup> group, size_t index)
      : group_(std::move(group)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (auto g = group_.lock()) g->OnGradReady(index_);
    return outputs;
  }

 private:
  std::weak_ptr<FsdpParamGroup> group_;
  size_t index_;
};

void ThrowIfError(const absl::Status& s) {
  TORCH_CHECK(s.ok(), "FullyShard: ", s.ToString());
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

// Reads the clocks only when the group's timer is on.
class FsdpParamGroup::PhaseScope {
 public:
  PhaseScope(const FsdpParamGroup& g, const char* phase)
      : g_(g), phase_(phase), on_(g.timer_enabled_ && g.timer_enabled_()) {
    if (!on_) return;
    wall_ = std::chrono::steady_clock::now();
    cpu_ = ThreadCpuSeconds();
  }
  ~PhaseScope() {
    if (!on_) return;
    g_.timer_record_(phase_, std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_).count(),
                     ThreadCpuSeconds() - cpu_);
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  const FsdpParamGroup& g_;
  const char* phase_;
  bool on_;
  std::chrono::steady_clock::time_point wall_;
  double cpu_ = 0;
};

FsdpParamGroup::FsdpParamGroup(std::string label, const DeviceMesh& mesh,
                               const MixedPrecisionPolicy& mp)
    : label_(std::move(label)), mesh_(mesh) {}

absl::StatusOr<std::shared_ptr<FsdpParamGroup>> FsdpParamGroup::Create(
    std::string label, std::vector<std::pair<std::string, at::Tensor>> params,
    const DeviceMesh& mesh, const MixedPrecisionPolicy& mp) {
  // A 2-D mesh must say it is HSDP (a ("dp", "tp") mesh passed whole is a
  // mistake: FullyShard takes its "dp" slice).
  const bool hsdp = mesh.ndim() == 2 && mesh.dim_names() == std::vector<std::string>{"dp_replicate", "dp_shard"};
  if (mesh.ndim() != 1 && !hsdp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FullyShard(", label, "): needs a 1-D mesh or a 2-D (\"dp_replicate\", \"dp_shard\") mesh for HSDP, got ",
        mesh.ToString()));
  }
  // HSDP: the last dim shards, the first replicates (torch FSDP2's 2-D mesh).
  const int shard_dim = mesh.ndim() - 1;
  for (int d = 0; d < mesh.ndim(); ++d) {
    const auto& pg = mesh.Group(d);
    if (pg->getSize() != mesh.size(d) || pg->getRank() != mesh.LocalRank(d)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FullyShard(", label, "): mesh ", mesh.ToString(), " has ", mesh.size(d), " ranks along dim ", d,
          " but its process group has ", pg->getSize(), " (rank ", pg->getRank(), ")"));
    }
  }
  std::shared_ptr<FsdpParamGroup> g(new FsdpParamGroup(std::move(label), mesh, mp));
  g->rank_ = mesh.LocalRank(shard_dim);
  g->world_ = mesh.size(shard_dim);
  g->shard_group_ = mesh.Group(shard_dim);
  if (mesh.ndim() == 2) {
    g->replicate_group_ = mesh.Group(0);
    g->replicate_world_ = mesh.size(0);
  }
  std::vector<std::vector<int64_t>> shapes;
  std::vector<at::Tensor> fulls;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    if (!p.defined() || !at::isFloatingType(p.scalar_type())) {
      return absl::InvalidArgumentError(
          absl::StrCat("FullyShard(", g->label_, "): parameter ", name, " is not floating point"));
    }
    if (p.dim() == 0) {
      return absl::InvalidArgumentError(absl::StrCat("FullyShard(", g->label_, "): parameter ", name,
                                                     " is 0-dim; pass it in ignored_params"));
    }
    if (i == 0) g->orig_dtype_ = p.scalar_type();
    if (p.scalar_type() != g->orig_dtype_) {
      return absl::InvalidArgumentError(absl::StrCat("FullyShard(", g->label_, "): parameter ", name,
                                                     " is ", c10::toString(p.scalar_type()),
                                                     ", others are ", c10::toString(g->orig_dtype_)));
    }
    shapes.push_back(p.sizes().vec());
    fulls.push_back(p.detach());
  }
  g->param_dtype_ = mp.param_dtype.value_or(g->orig_dtype_);
  g->reduce_dtype_ = mp.reduce_dtype.value_or(g->param_dtype_);
  auto layout = MakeFlatParamLayout(shapes, g->world_);
  if (!layout.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("FullyShard(", g->label_, "): ", layout.status().message()));
  }
  g->layout_ = *std::move(layout);
  g->flat_shard_ = MakeFlatShard(fulls, g->layout_, g->rank_, g->orig_dtype_);
  for (size_t i = 0; i < params.size(); ++i) {
    Param p;
    p.name = params[i].first;
    p.param = params[i].second;
    p.shard = ShardView(g->flat_shard_, g->layout_, i, g->rank_);
    p.trainable = p.param.requires_grad();
    g->num_trainable_ += p.trainable ? 1 : 0;
    p.param.set_data(p.shard);
    g->params_.push_back(std::move(p));
  }
  return g;
}

absl::StatusOr<DTensor> FsdpParamGroup::ShardedParam(size_t i) const {
  if (mesh_.ndim() == 2) {
    return FromLocal(params_[i].shard, mesh_, {Placement::Replicate(), Placement::Shard(0)},
                     layout_.entries[i].shape);
  }
  return FromLocal(params_[i].shard, mesh_, {Placement::Shard(0)}, layout_.entries[i].shape);
}

int64_t FsdpParamGroup::full_param_bytes() const {
  int64_t numel = 0;
  for (const FlatParamEntry& e : layout_.entries) numel += e.shape[0] * e.row_numel;
  return numel * static_cast<int64_t>(c10::elementSize(param_dtype_));
}

absl::Status FsdpParamGroup::WaitWork(const c10::intrusive_ptr<c10d::Work>& work, const char* op) {
  try {
    if (!work->wait(mesh_.collective_timeout_ms())) {
      return absl::DeadlineExceededError(absl::StrCat("FullyShard(", label_, "): ", op, " on rank ",
                                                      rank_, " timed out after ",
                                                      absl::FormatDuration(mesh_.collective_timeout())));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("FullyShard(", label_, "): ", op, " on rank ", rank_,
                                            " failed: ", ::tpudist::collectives::ExceptionMessage(e)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<at::Tensor>> FsdpParamGroup::GatherFullMaster() {
  at::Tensor in = flat_shard_.clone();
  at::Tensor out = at::empty({world_ * layout_.shard_numel}, in.options());
  c10::intrusive_ptr<c10d::Work> work;
  c10d::AllgatherOptions opts;
  opts.asyncOp = false;  // waited on right below
  try {
    work = shard_group_->_allgather_base(out, in, opts);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("FullyShard(", label_, "): state-dict all-gather on rank ",
                                            rank_, " failed: ", ::tpudist::collectives::ExceptionMessage(e)));
  }
  absl::Status s = WaitWork(work, "state-dict all-gather");
  if (!s.ok()) return s;
  return UnpackAllGather(out, layout_);
}

absl::Status FsdpParamGroup::SetShardsFromFull(absl::Span<const at::Tensor> full) {
  if (state_ != State::kSharded) {
    return absl::FailedPreconditionError(
        absl::StrCat("FullyShard(", label_, "): loading state while parameters are unsharded"));
  }
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size() && i < full.size(); ++i) {
    if (!full[i].defined()) continue;
    const FlatParamEntry& e = layout_.entries[i];
    if (full[i].sizes() != at::IntArrayRef(e.shape)) {
      return absl::InvalidArgumentError(absl::StrCat("FullyShard(", label_, "): ", params_[i].name,
                                                     " has shape ", c10::str(full[i].sizes()),
                                                     ", the model has ", c10::str(at::IntArrayRef(e.shape))));
    }
    const ChunkExtent rows = ShardRows(e, world_, rank_);
    params_[i].shard.copy_(full[i].narrow(0, rows.offset, rows.size));
  }
  return absl::OkStatus();
}

absl::Status FsdpParamGroup::StartUnshard(bool waits_now) {
  if (state_ != State::kSharded) return absl::OkStatus();
  PhaseScope timed(*this, "unshard_issue");
  gather_in_ = flat_shard_.to(param_dtype_);  // copy even when the dtype matches
  if (gather_in_.data_ptr() == flat_shard_.data_ptr()) gather_in_ = gather_in_.clone();
  gather_out_ = at::empty({world_ * layout_.shard_numel}, gather_in_.options());
  c10d::AllgatherOptions opts;
  opts.asyncOp = !waits_now;
  try {
    gather_work_ = shard_group_->_allgather_base(gather_out_, gather_in_, opts);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("FullyShard(", label_, "): all-gather of ",
                                            gather_in_.nbytes(), " bytes on rank ", rank_,
                                            " failed: ", ::tpudist::collectives::ExceptionMessage(e)));
  }
  ++num_all_gathers_;
  state_ = State::kGathering;
  if (memory_observer_) memory_observer_(gathered_bytes());
  Trace("all_gather_issued");
  return absl::OkStatus();
}

absl::Status FsdpParamGroup::WaitUnshard() {
  if (state_ == State::kUnsharded) return absl::OkStatus();
  if (state_ == State::kSharded) {
    absl::Status s = StartUnshard(/*waits_now=*/true);
    if (!s.ok()) return s;
  }
  absl::Status s;
  {
    PhaseScope timed(*this, "all_gather_wait");
    s = WaitWork(gather_work_, "all-gather");
  }
  gather_work_.reset();
  if (!s.ok()) return s;
  {
    PhaseScope timed(*this, "unpack");
    std::vector<at::Tensor> full = UnpackAllGather(gather_out_, layout_);
    gather_in_ = at::Tensor();
    gather_out_ = at::Tensor();
    for (size_t i = 0; i < params_.size(); ++i) params_[i].param.set_data(full[i]);
  }
  state_ = State::kUnsharded;
  if (memory_observer_) memory_observer_(full_param_bytes() - gathered_bytes());
  Trace("unsharded");
  if (torch::autograd::GradMode::is_enabled()) HookGradAccumulators();
  return absl::OkStatus();
}

void FsdpParamGroup::HookGradAccumulators() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (!p.trainable) continue;
    // set_data with a new dtype drops the weak accumulator; the one the next
    // forward uses is the one made now, with full-shape metadata.
    c10::intrusive_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(p.param);
    if (!acc || acc == p.grad_acc) continue;
    acc->add_post_hook(std::make_unique<GradReadyHook>(weak_from_this(), i));
    p.grad_acc = std::move(acc);
  }
}

absl::Status FsdpParamGroup::Reshard() {
  if (state_ == State::kSharded) return absl::OkStatus();
  if (state_ == State::kGathering) {  // prefetched but not used
    absl::Status s = WaitWork(gather_work_, "all-gather");
    gather_work_.reset();
    gather_in_ = at::Tensor();
    gather_out_ = at::Tensor();
    state_ = State::kSharded;
    if (memory_observer_) memory_observer_(-gathered_bytes());
    return s;
  }
  for (Param& p : params_) p.param.set_data(p.shard);
  state_ = State::kSharded;
  if (memory_observer_) memory_observer_(-full_param_bytes());
  Trace("resharded");
  return absl::OkStatus();
}

void FsdpParamGroup::BeginBackward() {
  if (backward_started_) return;
  backward_started_ = true;
  grads_reduced_ = false;
  ready_count_ = 0;
  for (Param& p : params_) {
    p.grad_ready = false;
    // A shard grad from an earlier step (no zero_grad, or sync-off steps)
    // would not fit the full grad AccumulateGrad is about to write.
    if (p.param.grad().defined()) {
      p.stashed_grad = p.param.grad();
      p.param.mutable_grad().reset();
    }
  }
}

void FsdpParamGroup::OnGradReady(size_t i) {
  if (!backward_started_ || grads_reduced_ || params_[i].grad_ready) return;
  params_[i].grad_ready = true;
  if (++ready_count_ == num_trainable_) ThrowIfError(ReduceGrads());
}

absl::Status FsdpParamGroup::ReduceGrads() {
  if (grads_reduced_) return absl::OkStatus();
  PhaseScope timed(*this, "reduce_issue");
  grads_reduced_ = true;
  std::vector<at::Tensor> grads(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (!p.trainable) continue;
    at::Tensor g = p.param.grad();
    p.param.mutable_grad().reset();
    if (g.defined() && g.sizes() != at::IntArrayRef(layout_.entries[i].shape)) {
      return absl::InternalError(absl::StrCat("FullyShard(", label_, "): grad of ", p.name,
                                              " has shape ", c10::str(g.sizes()),
                                              ": the parameter was used while sharded"));
    }
    // Left in param_dtype: the pack below casts while it copies (one pass,
    // no per-parameter temporary); only accumulation needs reduce_dtype.
    if (p.accumulated.defined()) {
      g = g.defined() ? p.accumulated.add(g).to(reduce_dtype_) : p.accumulated;
      p.accumulated = at::Tensor();
    }
    grads[i] = g;
  }
  absl::Status s = Reshard();
  if (!s.ok()) return s;
  if (!requires_gradient_sync_) {
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].accumulated = grads[i].defined() ? grads[i].to(reduce_dtype_) : grads[i];
    }
    Trace("grads_accumulated");
    return absl::OkStatus();
  }
  if (num_trainable_ == 0) return absl::OkStatus();
  reduce_in_ = PackReduceScatterInput(grads, layout_, reduce_dtype_);
  grads.clear();
  reduce_out_ = at::empty({layout_.shard_numel}, reduce_in_.options());
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = c10d::ReduceOp::AVG;
  opts.timeout = mesh_.collective_timeout_ms();
  try {
    reduce_work_ = shard_group_->_reduce_scatter_base(reduce_out_, reduce_in_, opts);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("FullyShard(", label_, "): reduce-scatter of ",
                                            reduce_in_.nbytes(), " bytes on rank ", rank_,
                                            " failed: ", ::tpudist::collectives::ExceptionMessage(e)));
  }
  ++num_reduce_scatters_;
  Trace("reduce_scatter_issued");
  return absl::OkStatus();
}

absl::Status FsdpParamGroup::FinishReduceGrads() {
  if (!reduce_work_) {
    // No reduce this backward (sync off or nothing trainable): restore the
    // stashed shard grads untouched.
    for (Param& p : params_) {
      if (p.stashed_grad.defined()) p.param.mutable_grad() = std::move(p.stashed_grad);
    }
    return absl::OkStatus();
  }
  absl::Status s;
  {
    PhaseScope timed(*this, "reduce_scatter_wait");
    s = WaitWork(reduce_work_, "reduce-scatter");
  }
  reduce_work_.reset();
  reduce_in_ = at::Tensor();
  if (!s.ok()) return s;
  if (replicate_group_ && replicate_world_ > 1) {
    // HSDP (torch FSDP2's foreach_reduce): the reduce-scatter output, still
    // in reduce_dtype and already the AVG over dp_shard, is all-reduced AVG
    // over dp_replicate: sum / (shard * replicate), the whole dp world.
    PhaseScope timed(*this, "all_reduce_wait");
    std::vector<at::Tensor> list = {reduce_out_};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::AVG;
    opts.timeout = mesh_.collective_timeout_ms();
    opts.asyncOp = false;  // waited on at once
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = replicate_group_->allreduce(list, opts);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("FullyShard(", label_, "): all-reduce over dp_replicate of ",
                                              reduce_out_.nbytes(), " bytes on mesh rank ", mesh_.global_rank(),
                                              " failed: ", ::tpudist::collectives::ExceptionMessage(e)));
    }
    ++num_all_reduces_;
    Trace("all_reduce_issued");
    s = WaitWork(work, "all-reduce over dp_replicate");
    if (!s.ok()) return s;
  }
  PhaseScope timed(*this, "reduce_finish");
  // The shard grads alias one flat buffer in the master dtype (the
  // reduce-scatter output itself when the dtypes match): one cast at most,
  // no per-parameter copy.
  const at::Tensor flat_grad = reduce_out_.scalar_type() == orig_dtype_ ? reduce_out_
                                                                        : reduce_out_.to(orig_dtype_);
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (!p.trainable) continue;
    at::Tensor g = AliasShard(flat_grad, layout_, i, rank_);
    if (p.stashed_grad.defined()) g = p.stashed_grad.add_(g);
    p.stashed_grad = at::Tensor();
    p.param.mutable_grad() = g;
  }
  reduce_out_ = at::Tensor();
  return absl::OkStatus();
}

void FsdpParamGroup::EndBackward() {
  backward_started_ = false;
  ready_count_ = 0;
}

}  // namespace tpudist::fsdp
