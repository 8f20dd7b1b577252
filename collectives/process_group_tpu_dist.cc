// Process-group plumbing: construction (host-id exchange, shm setup),
// subgroups, the op queue, and the in-place ops (allreduce, broadcast,
// reduce), barrier and send/recv. The gather / scatter family lives in
// process_group_gather_ops.cc.
#include "collectives/process_group_tpu_dist.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "collectives/exception_message.h"
#include "collectives/fast_clock.h"
#include "collectives/generation_store.h"
#include "collectives/hierarchical_backend.h"
#include "collectives/shm/algorithms.h"
#include "collectives/slice_backend.h"
#include "collectives/tensor_bridge.h"
#include "collectives/work.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace tpudist::collectives {
namespace {

template <typename T>
T ValueOrThrow(absl::StatusOr<T> v) {
  ThrowIfError(v.status());
  return *std::move(v);
}

}  // namespace

ProcessGroupTpuDist::ProcessGroupTpuDist(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    Options options)
    : c10d::Backend(rank, size),
      options_(std::move(options)),
      timeout_ms_(options_.timeout.count()) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "tpu_dist: bad rank ",
              rank, " for world size ", size);
  base_store_ = store;
  if (options_.flight_recorder_entries > 0) MakeFlightRecorder();
  Connect(store);
}

void ProcessGroupTpuDist::MakeFlightRecorder() {
  FlightRecorder::Group group;
  group.name = options_.group_name;
  group.global_ranks = options_.global_ranks;
  if (static_cast<int>(group.global_ranks.size()) != size_) {
    group.global_ranks.resize(size_);
    for (int r = 0; r < size_; ++r) group.global_ranks[r] = r;
  }
  recorder_ = std::make_shared<FlightRecorder>(
      static_cast<size_t>(options_.flight_recorder_entries), std::move(group));
  recorder_->set_global_rank(recorder_->group().global_ranks[rank_]);
  RegisterFlightRecorder(recorder_, options_.flight_recorder_dump_prefix);
}

// The connections of generation `store` (host ids, shm segments, TCP mesh
// and p2p, op threads) for rank_ of size_: the constructor's and
// Reconfigure's.
void ProcessGroupTpuDist::Connect(const c10::intrusive_ptr<c10d::Store>& store) {
  const int rank = rank_;
  const int size = size_;
  store_ = GenerationStore(store, "tpu_dist", options_.group_name, rank);
  // Placement: every rank publishes its (slice id, host id); the layout
  // decides the path (shm / hosts of one slice / slices over DCN).
  const std::string host_id = DefaultHostId(options_.host_id);
  layout_ = ExchangePlacement(*store_, rank, size, host_id, options_.slice_id, options_.timeout);
  shm::CommOptions comm_options;
  comm_options.job_id = options_.job_id;
  comm_options.group_name = options_.group_name;
  comm_options.slot_bytes = options_.shm_slot_bytes;
  comm_options.num_slots = options_.shm_num_slots;
  comm_options.assume_foreign_load = options_.shm_assume_foreign_load;
  comm_options.sync = options_.shm_sync;
  comm_options.fastbox = options_.shm_fastbox;
  comm_options.setup_timeout = absl::FromChrono(options_.timeout);
  comm_options.wait = options_.wait;
  tcp::TcpP2pOptions p2p_options;
  p2p_options.group_key = absl::StrCat(options_.job_id, "/", options_.group_name);
  p2p_options.secret = options_.job_secret;
  BindAddress addr;  // multi-host only
  if (!layout_.single_host()) {
    addr = ValueOrThrow(
        ResolveBindAddress(options_.bind_address, options_.worker_hostname, host_id));
    p2p_options.bind_address = addr.bind;
    p2p_options.advertise_address = addr.advertise;
  }
  // TCP point-to-point for peers on other hosts (every peer without shm_p2p).
  const bool shm_p2p = options_.shm_p2p && !options_.p2p_over_store;
  if (!options_.p2p_over_store && !(shm_p2p && layout_.single_host())) {
    p2p_ = ValueOrThrow(tcp::TcpP2p::Start(*store_, rank, size, p2p_options));
  }
  if (layout_.single_host()) {
    backend_ = std::make_unique<ShmBackend>(
        ValueOrThrow(shm::Communicator::Create(*store_, rank, size, comm_options)),
        options_.small_allreduce_bytes);
  } else {
    // Spans hosts: shm inside each host, TCP between them.
    HierarchicalOptions hier;
    hier.shm = comm_options;
    hier.small_allreduce_bytes = options_.small_allreduce_bytes;
    hier.multi_rail_min_bytes = options_.multi_rail_min_bytes;
    hier.rail_chunk_bytes = options_.rail_chunk_bytes;
    hier.bind_address = addr.bind;
    hier.advertise_address = addr.advertise;
    hier.connect_timeout = absl::FromChrono(options_.timeout);
    hier.job_secret = options_.job_secret;
    backend_ = ValueOrThrow(CreateMultiHostBackend(store_, rank, size, layout_, hier));
  }
  shm::Communicator* local = backend_->local_communicator();
  if (shm_p2p && local != nullptr && local->size() > 1 && local->p2p_ring_bytes() > 0) {
    shm_p2p_ = std::make_unique<shm::ShmP2p>(local);
  }
  p2p_worker_ = std::make_unique<OpWorker>("tpud-p2p");
  worker_ = std::make_unique<OpWorker>("tpud-op");
  if (recorder_) {
    // Another rank's dump request reaches this one through the group's store.
    fr_watcher_ = std::make_unique<FlightRecorderWatcher>(store_, absl::Seconds(1));
  }
}

void ProcessGroupTpuDist::setGroupUid(const std::string& pg_uid) {
  c10d::Backend::setGroupUid(pg_uid);
  if (recorder_) recorder_->Rename(pg_uid, "");
}

uint64_t ProcessGroupTpuDist::FrRecord(const char* name, c10d::OpType type, uint64_t seq,
                                       std::chrono::milliseconds timeout,
                                       c10::ArrayRef<at::Tensor> inputs,
                                       c10::ArrayRef<at::Tensor> outputs, int peer,
                                       int64_t started_at_ns) {
  if (!fr_desc_synced_.load(std::memory_order_relaxed) && !fr_desc_synced_.exchange(true)) {
    // torch sets the description (default_pg, ...) after construction, before any op.
    recorder_->Rename("", getGroupDesc());
  }
  // Written into the ring entry in place: no allocation per op once the
  // ring has wrapped (the entry's vectors and name keep their capacity).
  const bool p2p = type == c10d::OpType::SEND || type == c10d::OpType::RECV;
  const uint64_t p2p_seq = p2p ? ++fr_p2p_seq_ : 0;
  auto describe = [](c10::ArrayRef<at::Tensor> ts, std::vector<std::vector<int64_t>>& sizes,
                     std::vector<c10::ScalarType>& dtypes) {
    sizes.resize(ts.size());
    dtypes.resize(ts.size());
    for (size_t i = 0; i < ts.size(); ++i) {
      const c10::IntArrayRef s = ts[i].sizes();
      sizes[i].assign(s.begin(), s.end());
      dtypes[i] = ts[i].scalar_type();
    }
  };
  const absl::string_view torch_name = p2p ? absl::string_view() : TorchOpName(name);
  return recorder_->RecordInPlace([&](FlightRecorder::Op& op) {
    op.collective_seq_id = seq;
    op.is_p2p = p2p;
    op.p2p_seq_id = p2p_seq;
    if (p2p) {
      // torch's spelling: "send <src>-><dst>", "recv <dst><-<src>" (group ranks).
      op.name = type == c10d::OpType::SEND ? absl::StrCat("send ", rank_, "->", peer)
                                           : absl::StrCat("recv ", rank_, "<-", peer);
    } else {
      // A ring entry mostly held the same op before: keep its name then.
      if (op.name != torch_name) op.name.assign(torch_name.data(), torch_name.size());
    }
    describe(inputs, op.input_sizes, op.input_dtypes);
    describe(outputs, op.output_sizes, op.output_dtypes);
    op.timeout_ms = timeout.count();
  }, started_at_ns);
}

void ProcessGroupTpuDist::FrFinished(uint64_t id, const absl::Status& status) {
  recorder_->Finished(id, status);
  if (status.ok() || fr_failure_dumped_.exchange(true)) return;
  // The group's first failure (its later ops fail fast with the same cause):
  // dump this process's groups, and have every rank of the group dump too.
  AutoDumpFlightRecorders(absl::StrCat("group '", options_.group_name, "' rank ", rank_, ": ",
                                       absl::StatusCodeToString(status.code())),
                          /*force=*/false);
  if (fr_watcher_) fr_watcher_->RequestDumpEverywhere();
}

bool ProcessGroupTpuDist::StopThreads() {
  if (fr_watcher_) fr_watcher_->Stop();
  if (worker_ == nullptr) return true;  // a failed Reconfigure left none
  // An op ends by its own deadline; a queue of ops that keep finishing is
  // waited for however long it takes, an op stuck past the group timeout
  // (plus this grace) is aborted.
  constexpr absl::Duration kGrace = absl::Seconds(5);
  const absl::Duration patience = absl::FromChrono(timeout()) + kGrace;
  if (worker_->OnWorkerThread() || p2p_worker_->OnWorkerThread()) {
    // From an op's closure (a future callback): a thread cannot wait for
    // itself; both leave once their queues are done.
    worker_->Stop(absl::InfinitePast());
    p2p_worker_->Stop(absl::InfinitePast());
    return false;
  }
  bool stopped = false;
  for (int64_t done = -1; !stopped;) {
    const int64_t now_done = worker_->ops_done();
    if (now_done == done) break;  // no progress for a whole patience
    done = now_done;
    stopped = worker_->Stop(absl::Now() + patience);
  }
  if (!stopped) {
    Abort(absl::DeadlineExceededError(absl::StrCat(
        "tpu_dist group '", options_.group_name, "' on rank ", rank_,
        ": the op in flight made no progress for ", absl::FormatDuration(patience),
        " while the group shut down (destroy_process_group or interpreter exit)")));
    stopped = worker_->Stop(absl::Now() + kGrace);
  }
  // Recvs still pending fail now instead of waiting out their timeout.
  const absl::Status cancelled = absl::CancelledError(absl::StrCat(
      "tpu_dist group '", options_.group_name, "' shut down with this recv pending"));
  if (p2p_) p2p_->Abort(cancelled);
  if (shm_p2p_) shm_p2p_->Abort(cancelled);
  return p2p_worker_->Stop(absl::Now() + kGrace) && stopped;
}

ProcessGroupTpuDist::~ProcessGroupTpuDist() {
  fr_watcher_.reset();
  worker_.reset();
  // Recvs still pending fail now instead of waiting out their timeout.
  const absl::Status destroyed = absl::CancelledError(absl::StrCat(
      "tpu_dist group '", options_.group_name, "' destroyed with this recv pending"));
  if (p2p_) p2p_->Abort(destroyed);
  if (shm_p2p_) shm_p2p_->Abort(destroyed);
  p2p_worker_.reset();
  p2p_.reset();
  shm_p2p_.reset();  // before backend_, whose segments it uses
}

c10::intrusive_ptr<ProcessGroupTpuDist> ProcessGroupTpuDist::NewSubgroup(
    const c10::intrusive_ptr<c10d::Store>& parent_store, int global_rank,
    const std::vector<int>& global_ranks, Options options) {
  int group_rank = -1;
  for (size_t i = 0; i < global_ranks.size(); ++i) {
    if (global_ranks[i] == global_rank) group_rank = static_cast<int>(i);
  }
  TORCH_CHECK(group_rank >= 0, "tpu_dist: NewSubgroup: global rank ",
              global_rank, " is not in [", absl::StrJoin(global_ranks, ","), "]");
  if (options.group_name.empty() || options.group_name == "default") {
    options.group_name = absl::StrCat("sub_", absl::StrJoin(global_ranks, "_"));
  }
  options.global_ranks.assign(global_ranks.begin(), global_ranks.end());
  return c10::make_intrusive<ProcessGroupTpuDist>(
      parent_store, group_rank, static_cast<int>(global_ranks.size()),
      std::move(options));
}

absl::Status ProcessGroupTpuDist::status() const {
  if (backend_ == nullptr) return disconnected_;  // a failed Reconfigure
  return backend_->poison_status();
}

c10d::ErrorType ProcessGroupTpuDist::getError() {
  const absl::Status s = status();
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return c10d::ErrorType::SUCCESS;
    case absl::StatusCode::kDeadlineExceeded:
      return c10d::ErrorType::TIMEOUT;
    case absl::StatusCode::kUnavailable:  // a peer's connection or the job lost
      return c10d::ErrorType::REMOTE_ERROR;
    default:
      return c10d::ErrorType::COMM_ERROR;
  }
}

void ProcessGroupTpuDist::Abort(const absl::Status& cause) {
  const absl::Status c = cause.ok() ? absl::AbortedError("tpu_dist: Abort(OK)") : cause;
  if (p2p_) p2p_->Abort(c);
  if (shm_p2p_) shm_p2p_->Abort(c);
  if (backend_) backend_->Abort(c);
  if (recorder_) AutoDumpFlightRecorders(absl::StrCat("abort: ", c.message()), /*force=*/false);
}

void ProcessGroupTpuDist::abort() {
  Abort(absl::AbortedError(absl::StrCat("tpu_dist group '", options_.group_name,
                                        "': abort() called")));
}

std::chrono::milliseconds ProcessGroupTpuDist::OpTimeout(
    std::chrono::milliseconds requested) const {
  return requested == c10d::kUnsetTimeout ? timeout() : requested;
}

absl::Status ProcessGroupTpuDist::RunBody(const char* name, std::chrono::milliseconds timeout,
                                          int64_t bytes, absl::Time start, BodyRef body,
                                          WaitHook* while_waiting) {
  OpContext ctx;
  ctx.name = name;
  ctx.bytes = bytes;
  ctx.start = start;
  ctx.timeout = absl::FromChrono(timeout);
  ctx.while_waiting = while_waiting;
  try {
    return body(*backend_, ctx);
  } catch (const std::exception& e) {  // torch copy_ / store errors
    return backend_->Poison(absl::InternalError(
        absl::StrCat(name, ": ", ::tpudist::collectives::ExceptionMessage(e))));
  }
}

bool ProcessGroupTpuDist::FrRecords(c10d::OpType type) const {
  return recorder_ != nullptr && type != c10d::OpType::ALLREDUCE_COALESCED &&
         type != c10d::OpType::ALLGATHER_COALESCED &&
         type != c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED &&
         type != c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::RunInline(
    const char* name, c10d::OpType type, std::chrono::milliseconds timeout, int64_t bytes,
    bool caller_waits, c10::ArrayRef<at::Tensor> outputs, BodyRef body,
    c10::ArrayRef<at::Tensor> inputs, int peer) {
  TORCH_CHECK(worker_ != nullptr, "tpu_dist group '", options_.group_name, "' rank ", rank_,
              ": ", name, " after a failed Reconfigure: ", disconnected_.ToString());
  // Collectives whose caller waits at once (c10d's asyncOp == false) run on
  // the calling thread when the queue is idle (issue order is unaffected):
  // no thread handoff, no closure; scheduled and started are one time. An
  // async op (the c10d default; FSDP's prefetch, Python's async_op=True) goes
  // to the worker: run inline it would block its issuer until every peer
  // arrived; a wait() on it while it is still next in an idle queue runs it
  // on the waiter (work.h). A recv waits on the p2p worker: it must block
  // neither the issuer nor the collectives queued after it.
  if (type == c10d::OpType::RECV || !caller_waits || bytes > options_.inline_max_bytes ||
      !worker_->BeginInline()) {
    return {};
  }
  const bool fr = FrRecords(type);
  const int64_t now_ns = FastUnixNanos();
  // The op's bookkeeping (its flight-recorder entry, recorded as started at
  // now_ns, and its Work) runs while the backend waits for a peer that has
  // not arrived yet, where it costs no time, or after the op. Either way the
  // entry exists before this rank can block on anyone: a backend whose
  // waits do not run the hook (TCP between hosts) gets it before the op.
  uint64_t fr_id = 0;
  bool recorded = false;
  c10::intrusive_ptr<TpuDistWork> work;
  const uint64_t seq = op_seq_;  // read under issue_mu_, which the caller holds
  auto bookkeeping = [&] {
    if (fr) {
      fr_id = FrRecord(name, type, seq, timeout, inputs.empty() ? outputs : inputs, outputs, peer,
                       now_ns);
      recorded = true;
    }
    work = c10::make_intrusive<TpuDistWork>(rank_, type, outputs, timeout);
  };
  WaitHook hook([](void* f) { (*static_cast<decltype(bookkeeping)*>(f))(); }, &bookkeeping);
  if (!options_.bookkeeping_while_waiting || !backend_->RunsWaitHooks()) hook.Run();
  const absl::Status s =
      RunBody(name, timeout, bytes, absl::FromUnixNanos(now_ns), body, &hook);
  hook.Run();
  // A hook that threw inside the op (out of memory) poisoned the group
  // (RunBody) and may have left no Work.
  if (work == nullptr) work = c10::make_intrusive<TpuDistWork>(rank_, type, outputs, timeout);
  if (recorded) FrFinished(fr_id, s);
  // The worker counts as idle before the Work completes, so a caller woken
  // by the completion can run its next op inline too. (Nobody holds the
  // Work yet: it completes without a lock or a wake.)
  worker_->EndInline();
  work->FinishUnshared(s);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::EnqueueOnWorker(
    const char* name, c10d::OpType type, std::chrono::milliseconds timeout, int64_t bytes,
    c10::ArrayRef<at::Tensor> outputs, OpBody body, c10::ArrayRef<at::Tensor> inputs, int peer) {
  TORCH_CHECK(worker_ != nullptr, "tpu_dist group '", options_.group_name, "' rank ", rank_,
              ": ", name, " after a failed Reconfigure: ", disconnected_.ToString());
  // Flight recorder: scheduled here, started and ended around the op.
  const bool fr = FrRecords(type);
  // A held future completes on the worker's callback threads (work.h).
  CallbackThreads* callbacks =
      (type == c10d::OpType::RECV ? p2p_worker_ : worker_)->callbacks();
  const uint64_t fr_id =
      fr ? FrRecord(name, type, op_seq_, timeout, inputs.empty() ? outputs : inputs, outputs, peer)
         : 0;
  auto work = c10::make_intrusive<TpuDistWork>(rank_, type, outputs, timeout);
  TpuDistWork* result = work.get();
  // `run` leaves the op's status in the Work (which `finish` holds, so it
  // outlives `run`); `finish` completes the Work with it after the worker
  // counts as idle again (OpWorker's `then`).
  std::function<void()> finish = [work, callbacks] { work->Finish(work->op_status(), callbacks); };
  std::function<void()> run = [this, result, name, timeout, bytes, fr, fr_id,
                               body = std::move(body)]() mutable {
    const int64_t start_ns = FastUnixNanos();
    if (fr) recorder_->Started(fr_id, start_ns);
    const absl::Status s =
        RunBody(name, timeout, bytes, absl::FromUnixNanos(start_ns), BodyRef::To(body), nullptr);
    if (fr) FrFinished(fr_id, s);
    result->set_op_status(s);
  };
  if (type == c10d::OpType::RECV) {
    work->set_queued_op(p2p_worker_->Enqueue(std::move(run), std::move(finish)));
  } else {
    work->set_queued_op(worker_->Enqueue(std::move(run), std::move(finish)));
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "tpu_dist: allreduce takes exactly one tensor");
  TORCH_CHECK(tensors[0].layout() == c10::kStrided, "tpu_dist: allreduce: only dense tensors are "
              "supported, got layout ", tensors[0].layout(), " (use .to_dense())");
  at::Tensor t = tensors[0];
  const DataType dtype = ValueOrThrow(ToDataType(t.scalar_type(), "allreduce"));
  const ReduceKind kind = ValueOrThrow(ToReduceKind(opts.reduceOp, dtype));
  ThrowIfError(CheckReducible(dtype, kind));
  absl::MutexLock lock(&issue_mu_);
  const uint32_t seq = NextSeq();
  return Enqueue("allreduce", c10d::OpType::ALLREDUCE, OpTimeout(opts.timeout),
                 t.nbytes(), !opts.asyncOp, tensors,
                 [t, dtype, kind, seq](CollectiveBackend& comm,
                                             const OpContext& ctx) mutable {
                   at::Tensor buf = ContiguousBuffer(t);  // [t.sizes()]
                   OpSpec spec{ctx, seq, dtype, ShapeOf(t), t.numel()};
                   absl::Status s = comm.AllReduce(spec, kind, buf.data_ptr());
                   if (s.ok()) CopyBackIfNeeded(t, buf);
                   return s;
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "tpu_dist: broadcast takes exactly one tensor");
  TORCH_CHECK(tensors[0].layout() == c10::kStrided, "tpu_dist: broadcast: only dense tensors are "
              "supported, got layout ", tensors[0].layout(), " (use .to_dense())");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_,
              "tpu_dist: broadcast root ", opts.rootRank, " out of range");
  at::Tensor t = tensors[0];
  const DataType dtype = ValueOrThrow(ToDataType(t.scalar_type(), "broadcast"));
  const int root = static_cast<int>(opts.rootRank);
  absl::MutexLock lock(&issue_mu_);
  const uint32_t seq = NextSeq();
  return Enqueue("broadcast", c10d::OpType::BROADCAST, OpTimeout(opts.timeout),
                 t.nbytes(), !opts.asyncOp, tensors,
                 [t, dtype, root, seq](CollectiveBackend& comm,
                                       const OpContext& ctx) mutable {
                   at::Tensor buf = ContiguousBuffer(t);  // [t.sizes()]
                   OpSpec spec{ctx, seq, dtype, ShapeOf(t), t.numel()};
                   absl::Status s = comm.Broadcast(spec, root, buf.data_ptr(),
                                                   t.nbytes());
                   if (s.ok()) CopyBackIfNeeded(t, buf);
                   return s;
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::reduce(
    std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "tpu_dist: reduce takes exactly one tensor");
  TORCH_CHECK(tensors[0].layout() == c10::kStrided, "tpu_dist: reduce: only dense tensors are "
              "supported, got layout ", tensors[0].layout(), " (use .to_dense())");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_,
              "tpu_dist: reduce root ", opts.rootRank, " out of range");
  at::Tensor t = tensors[0];
  const DataType dtype = ValueOrThrow(ToDataType(t.scalar_type(), "reduce"));
  const ReduceKind kind = ValueOrThrow(ToReduceKind(opts.reduceOp, dtype));
  ThrowIfError(CheckReducible(dtype, kind));
  const int root = static_cast<int>(opts.rootRank);
  absl::MutexLock lock(&issue_mu_);
  const uint32_t seq = NextSeq();
  return Enqueue("reduce", c10d::OpType::REDUCE, OpTimeout(opts.timeout),
                 t.nbytes(), !opts.asyncOp, tensors,
                 [t, dtype, kind, root, seq](CollectiveBackend& comm,
                                             const OpContext& ctx) mutable {
                   at::Tensor buf = ContiguousBuffer(t);  // [t.sizes()]
                   OpSpec spec{ctx, seq, dtype, ShapeOf(t), t.numel()};
                   absl::Status s = comm.Reduce(spec, kind, root, buf.data_ptr());
                   if (s.ok()) CopyBackIfNeeded(t, buf);
                   return s;
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::barrier(
    const c10d::BarrierOptions& opts) {
  absl::MutexLock lock(&issue_mu_);
  const uint32_t seq = NextSeq();
  return Enqueue("barrier", c10d::OpType::BARRIER, OpTimeout(opts.timeout), 0,
                 !opts.asyncOp, {}, [seq](CollectiveBackend& comm, const OpContext& ctx) {
                   OpSpec spec{ctx, seq, DataType::kUInt8, {}, 0};
                   return comm.Barrier(spec);
                 });
}

int64_t ProcessGroupTpuDist::NextP2pIndex(const std::string& channel) {
  return p2p_counters_[channel]++;
}

// Point-to-point over TcpP2p (tcp_p2p.h), or, with Options::p2p_over_store,
// through the group's store: the sender sets a key named
// after (src, dst, tag, message index); the receiver waits for it, reads it
// and deletes it. Message indices count per (src, dst, tag) channel on both
// sides, so the n-th send matches the n-th recv. Buffered: send completes
// once the bytes are in the store.
c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::send(
    std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  TORCH_CHECK(tensors.size() == 1, "tpu_dist: send takes exactly one tensor");
  TORCH_CHECK(dst_rank >= 0 && dst_rank < size_ && dst_rank != rank_,
              "tpu_dist: send to invalid rank ", dst_rank);
  at::Tensor t = tensors[0];
  ValueOrThrow(ToDataType(t.scalar_type(), "send"));
  TORCH_CHECK(backend_ != nullptr, "tpu_dist group '", options_.group_name, "' rank ", rank_,
              ": send after a failed Reconfigure: ", disconnected_.ToString());
  // Flight recorder: a send runs on the caller, from scheduled to ended here.
  const uint64_t fr_id =
      recorder_ ? FrRecord("send", c10d::OpType::SEND, getSequenceNumberForGroup(), timeout(),
                           tensors, tensors, dst_rank)
                : 0;
  if (recorder_) recorder_->Started(fr_id);
  if (p2p_ || shm_p2p_) {
    const std::chrono::milliseconds op_timeout = timeout();
    auto work = c10::make_intrusive<TpuDistWork>(rank_, c10d::OpType::SEND, tensors,
                                                 op_timeout);
    absl::Status s;
    try {
      at::Tensor buf = ContiguousBuffer(t);  // [t.sizes()]
      const auto bytes =
          absl::MakeConstSpan(static_cast<const uint8_t*>(buf.data_ptr()), buf.nbytes());
      const absl::Time deadline = absl::Now() + absl::FromChrono(op_timeout);
      s = OnMyHost(dst_rank)
              ? shm_p2p_->Send(layout_.local_index[dst_rank], tag, bytes, deadline)
              : p2p_->Send(*store_, dst_rank, tag, bytes, deadline);
    } catch (const std::exception& e) {
      s = absl::InternalError(absl::StrCat("send on rank ", rank_, " to rank ", dst_rank, ": ",
                                           ::tpudist::collectives::ExceptionMessage(e)));
    }
    if (recorder_) FrFinished(fr_id, s);
    work->Finish(s);
    return work;
  }
  std::string key;
  {
    absl::MutexLock lock(&issue_mu_);
    const std::string channel = absl::StrCat("p2p/", rank_, "/", dst_rank, "/", tag);
    key = absl::StrCat(channel, "/", NextP2pIndex(channel));
  }
  // Buffered, on the calling thread: the Work is complete on return.
  auto work = c10::make_intrusive<TpuDistWork>(rank_, c10d::OpType::SEND, tensors,
                                               timeout());
  absl::Status s;
  try {
    at::Tensor buf = ContiguousBuffer(t);
    const uint8_t* p = static_cast<const uint8_t*>(buf.data_ptr());
    store_->set(key, std::vector<uint8_t>(p, p + buf.nbytes()));
  } catch (const std::exception& e) {
    s = absl::UnavailableError(absl::StrCat("send on rank ", rank_, " to rank ", dst_rank,
                                            " (", t.nbytes(), " bytes): ", ::tpudist::collectives::ExceptionMessage(e)));
  }
  if (recorder_) FrFinished(fr_id, s);
  work->Finish(s);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::recv(
    std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  TORCH_CHECK(tensors.size() == 1, "tpu_dist: recv takes exactly one tensor");
  TORCH_CHECK(src_rank >= 0 && src_rank < size_ && src_rank != rank_,
              "tpu_dist: recv from invalid rank ", src_rank);
  at::Tensor t = tensors[0];
  ValueOrThrow(ToDataType(t.scalar_type(), "recv"));
  absl::MutexLock lock(&issue_mu_);
  if (p2p_ || shm_p2p_) {
    tcp::TcpP2p* p2p = p2p_.get();
    shm::ShmP2p* local = OnMyHost(src_rank) ? shm_p2p_.get() : nullptr;
    const int local_src = layout_.local_index[src_rank];
    return Enqueue("recv", c10d::OpType::RECV, timeout(), t.nbytes(),
                   /*caller_waits=*/false, tensors,
                   [t, src_rank, local_src, tag, p2p, local](CollectiveBackend&,
                                                             const OpContext& ctx) mutable {
                     at::Tensor buf = ContiguousBuffer(t);  // [t.sizes()]
                     const auto bytes =
                         absl::MakeSpan(static_cast<uint8_t*>(buf.data_ptr()), buf.nbytes());
                     const absl::Time deadline = ctx.start + ctx.timeout;
                     absl::Status s = local != nullptr
                                          ? local->Recv(local_src, tag, bytes, deadline)
                                          : p2p->Recv(src_rank, tag, bytes, deadline);
                     if (s.ok()) CopyBackIfNeeded(t, buf);
                     return s;
                   },
                   /*inputs=*/{}, src_rank);
  }
  const std::string channel = absl::StrCat("p2p/", src_rank, "/", rank_, "/", tag);
  const std::string key = absl::StrCat(channel, "/", NextP2pIndex(channel));
  const int me = rank_;
  // Recvs wait on a connection of their own: c10d's TCPStore client holds
  // one lock per connection for a whole wait(), so a recv waiting on store_
  // would stall this rank's sends (store sets on the caller's thread), and two
  // ranks that each wait before sending would deadlock until the timeout.
  if (!p2p_store_) {
    try {
      p2p_store_ = store_->clone();
    } catch (const std::exception&) {
      p2p_store_ = store_;  // a store without clone(): shared, as before
    }
  }
  c10::intrusive_ptr<c10d::Store> p2p = p2p_store_;
  return Enqueue(
      "recv", c10d::OpType::RECV, timeout(), t.nbytes(), /*caller_waits=*/false, tensors,
      [t, key, src_rank, me, p2p](CollectiveBackend&, const OpContext& ctx) mutable {
        try {
          p2p->wait({key}, absl::ToChronoMilliseconds(ctx.timeout));
        } catch (const std::exception& e) {
          return absl::DeadlineExceededError(absl::StrCat(
              "recv on rank ", me, " from rank ", src_rank, " (", ctx.bytes,
              " bytes) timed out after ", absl::FormatDuration(ctx.timeout), ": ",
              ::tpudist::collectives::ExceptionMessage(e)));
        }
        const std::vector<uint8_t> bytes = p2p->get(key);
        p2p->deleteKey(key);
        if (static_cast<int64_t>(bytes.size()) != static_cast<int64_t>(t.nbytes())) {
          return absl::InvalidArgumentError(absl::StrCat(
              "recv on rank ", me, " from rank ", src_rank, ": expected ",
              t.nbytes(), " bytes, the sender sent ", bytes.size()));
        }
        at::Tensor buf = ContiguousBuffer(t);
        if (!bytes.empty()) std::memcpy(buf.data_ptr(), bytes.data(), bytes.size());
        CopyBackIfNeeded(t, buf);
        return absl::OkStatus();
      },
      /*inputs=*/{}, src_rank);
}

}  // namespace tpudist::collectives
