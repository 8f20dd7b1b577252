// ProcessGroupTpuDist: the "tpu_dist" c10d backend (torch 2.x c10d::Backend,
// as ProcessGroupGloo is).
//
// Usable wherever a libtorch C++ trainer uses ProcessGroupGloo. Most callers
// want the c10d::ProcessGroup that holds it (process_group_factory.h):
//
//   auto store = c10::make_intrusive<c10d::FileStore>(path, world);
//   ProcessGroupTpuDist::Options opts;            // timeout, group name, ...
//   auto pg = NewTpuDistProcessGroup(store, rank, world, opts);
//   pg->allreduce(tensors)->wait();
//
// The backend itself can also be driven directly:
//   auto backend = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, world, opts);
//
// Construction is collective: all `size` ranks construct the group over the
// same store (keys are namespaced by Options::group_name, which must be unique
// per store). The constructor exchanges host ids; when all ranks share a host
// it sets up the shared-memory communicator (collectives/shm); a group that
// spans hosts gets the hierarchical backend (hierarchical_backend.h): shm
// inside each host, TCP (collectives/tcp) among host leaders and a flat TCP
// mesh for gather/scatter/alltoall (see docs/collectives.md).
//
// Ops: allreduce (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR), reduce,
// allgather, _allgather_base, reduce_scatter, _reduce_scatter_base,
// broadcast, gather, scatter, alltoall, alltoall_base (even and uneven
// splits), barrier, send, recv, and the coalesced forms allreduce_coalesced,
// allgather_coalesced, allgather_into_tensor_coalesced,
// reduce_scatter_tensor_coalesced. dtypes: float32, float64, bfloat16, float16,
// int32, int64, uint8. Inputs may be non-contiguous. Each op call takes a
// list of exactly one tensor (for list-of-lists args, one inner list).
//
// Execution: every op call validates its local arguments (throwing
// c10::Error on misuse, like Gloo), then is queued on the group's single
// worker thread and returns an async Work. Ops run in issue order. Small
// collectives (<= Options::inline_max_bytes) whose caller waits at once --
// c10d's `asyncOp == false`, which Python's `async_op=False` sets; C++ callers
// set it in the op's options -- run on the calling thread when nothing is
// queued, saving two thread handoffs; their Work is already complete when
// returned. Ops issued with `asyncOp == true` (the c10d default: prefetches,
// functional collectives) always run on the worker so they overlap compute
// instead of blocking their issuer until every peer arrives. Errors
// (cross-rank mismatch, peer death, timeout) fail the Work on every rank and
// poison the group: later ops fail fast with the same cause.
//
// send/recv between ranks of one host go through shared memory (a ring per
// ordered pair in the host's shm segments, collectives/shm/p2p.h); between
// hosts over a TCP connection per ordered pair of ranks, made at the first
// send between them (collectives/tcp/tcp_p2p.h), authenticated with the job
// secret like the mesh. Neither occupies the collective queue: send is
// buffered (the receiver's reader thread drains its rings / sockets into
// per-(peer, tag) queues) and completes on the calling thread once its
// bytes are in the ring / the kernel; each recv waits on a second worker thread of its
// own (p2p), in issue order. So a pending recv delays neither collectives
// nor sends (batch_isend_irecv with the irecv first completes on every
// rank). Messages of one (peer, tag) arrive in send order. With
// Options::p2p_over_store they go through the store instead (the former
// path: correct, not fast; kept as a fallback and for the benchmark).
//
// Thread-safety: op methods may be called from any thread; the group orders
// them by call order.
#ifndef TPU_DIST_COLLECTIVES_PROCESS_GROUP_TPU_DIST_H_
#define TPU_DIST_COLLECTIVES_PROCESS_GROUP_TPU_DIST_H_

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "collectives/collective_backend.h"
#include "collectives/flight_recorder.h"
#include "collectives/flight_recorder_dump.h"
#include "collectives/host_layout.h"
#include "collectives/op_worker.h"
#include "collectives/shm/communicator.h"
#include "collectives/shm/p2p.h"
#include "collectives/tcp/tcp_p2p.h"
#include "torch/csrc/distributed/c10d/Backend.hpp"
#include "torch/csrc/distributed/c10d/Store.hpp"

namespace tpudist::collectives {

class TpuDistWork;

class ProcessGroupTpuDist : public c10d::Backend {
 public:
  // Explicit values only: collectives/ reads no environment variable.
  // distributed/group_config.h fills these from RankInfo (host index and
  // host list, job id) and the project's variables (TPU_DIST_HOST_ID,
  // TPU_DIST_JOB_ID, TPU_DIST_BIND_ADDRESS, TPU_DIST_JOB_SECRET[_FILE]).
  struct Options {
    std::chrono::milliseconds timeout = std::chrono::minutes(5);  // per op
    std::string group_name = "default";
    std::string host_id;  // "" -> DefaultHostId() ("<hostname>/<boot_id>")
    // This rank's slice (RankInfo::slice_index); -1 = unknown (slice 0).
    // With host_id it places the rank: a group spanning slices runs its
    // reductions slice-hierarchically over DCN (slice_backend.h).
    int slice_id = -1;
    std::string job_id;   // part of shm segment names; "" -> a random nonce only
    // Address the inter-host TCP listeners bind (multi-host groups only);
    // "0.0.0.0" / "::" = every interface; "" -> derived by
    // ResolveBindAddress from worker_hostname, a numeric host id, else this
    // host's address.
    std::string bind_address;
    // This host's entry of the slice's host list (a numeric IP or a name
    // that resolves to one); "" = unknown. See ResolveBindAddress.
    std::string worker_hostname;
    // Bytes of the job secret that authenticates the inter-host TCP
    // connections (tpu_runtime/job_secret.h); "" -> none (unauthenticated; a
    // warning when listening on a non-loopback address).
    std::string job_secret;
    // Per rank: bytes per slot and slots; 0: shm::ChooseSlotGeometry(ranks on
    // this host, usable cores) -- 8 x 256 KiB, or 2 x 2 MiB when ranks
    // outnumber cores.
    int64_t shm_slot_bytes = 0;
    int shm_num_slots = 0;
    // Take the shm paths meant for cores busy with other processes (phases
    // that run ahead, streamed broadcast) even on idle cores: tests and
    // experiments (shm::CommOptions::assume_foreign_load).
    bool shm_assume_foreign_load = false;
    // How shm ranks learn that every peer published a phase, and whether
    // small one-phase ops ride in the slot's fastbox line
    // (shm::CommOptions::sync / fastbox; the same on every rank). Defaults:
    // the communicator's choice (one arrival count) and fastboxes on. For
    // A/B runs (collectives_bench --shm_sync= --fastbox=).
    shm::CommOptions::Sync shm_sync = shm::CommOptions::Sync::kAuto;
    bool shm_fastbox = true;
    int64_t small_allreduce_bytes = 32 << 10;  // one-shot allreduce limit
    // Across hosts: payloads of at least this many bytes use every local
    // rank's TCP rail at once (HierarchicalOptions::multi_rail_min_bytes).
    int64_t multi_rail_min_bytes = 2 << 20;
    int64_t rail_chunk_bytes = 4 << 20;  // HierarchicalOptions::rail_chunk_bytes
    // Collectives of at most this many bytes issued with asyncOp == false run
    // on the calling thread when the group's queue is idle (their Work is
    // complete on return); async ones run on the worker thread so they
    // overlap compute. Default: any size (the caller blocks until the op
    // ends either way; on the worker a 64 KiB op paid two thread handoffs).
    // -1: never.
    int64_t inline_max_bytes = std::numeric_limits<int64_t>::max();
    // An inline op makes its flight-recorder entry and its Work while the
    // backend waits for a peer that has not arrived (OpContext's
    // while_waiting), instead of before the op. false: before; for A/B runs
    // (pg_options_bench).
    bool bookkeeping_while_waiting = true;
    // Spin / yield / futex back-off of the shm waits (collectives/shm/wait.h);
    // nullopt: shm::ChooseWaitPolicy(ranks on this host, usable cores).
    std::optional<shm::WaitPolicy> wait;
    // send/recv through the store (keys per message) instead of TCP p2p
    // connections: slower by 10x or more; for stores-only environments and
    // the benchmark's comparison.
    bool p2p_over_store = false;
    // send/recv between ranks of one host through shared memory (shm/p2p.h);
    // false: over TCP like those between hosts.
    bool shm_p2p = true;
    // Flight recorder (flight_recorder.h, docs/fault_tolerance.md): the last
    // ops kept per group (0: off). Dumps go to <flight_recorder_dump_prefix>
    // <global rank> (torch's format) on an op's failure (timeout, mismatch,
    // peer loss), Abort(), another rank's request and SIGUSR1; "": no
    // automatic dumps (on-demand dumps name their own prefix).
    int64_t flight_recorder_entries = 2000;
    std::string flight_recorder_dump_prefix;
    // The global rank of each group rank (torch's global_ranks_in_group),
    // as dumps name them; empty: 0..size-1.
    std::vector<int64_t> global_ranks;
  };

  // c10d's view of the options (process_group_options.cc): what
  // getBackendOptions() returns (torch's `Backend.options`) and what split()
  // and torch's pg_options take. The base fields `timeout` and `group_name`
  // are the group's (its current timeout, after any setTimeout); `tpu_dist`
  // holds every other knob (its own timeout and group_name are ignored).
  struct BackendOptions : c10d::Backend::Options {
    BackendOptions() : c10d::Backend::Options("tpu_dist") {}
    c10::intrusive_ptr<c10d::Backend::Options> clone() const override {
      return c10::make_intrusive<BackendOptions>(*this);
    }
    ProcessGroupTpuDist::Options tpu_dist;
  };

  // Collective over `store`; see the file comment. Throws c10::Error when the
  // store rendezvous or shm setup fails. Every construction is a new
  // generation of its group name: keys live under
  // "tpu_dist/<group_name>/g<k>/" of `store`, where k counts (in the store)
  // this rank's constructions of that name, and shm names carry a nonce made
  // for this generation -- so a group re-made over the same store after
  // destroy_process_group (env:// reuses rank 0's TCPStore) reads none of its
  // predecessor's keys. Ranks make a name's generations in the same order.
  ProcessGroupTpuDist(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                      int size, Options options);
  ~ProcessGroupTpuDist() override;

  // A group over `global_ranks` (in that order: group rank i is
  // global_ranks[i]) of a parent group whose store is `parent_store`. Only
  // members call it, all with the same list. The group's keys live under a
  // PrefixStore named after options.group_name (default "sub_<r0>_<r1>..."),
  // so use distinct names for distinct subgroups over the same ranks.
  // Throws c10::Error if `global_rank` is not in the list.
  static c10::intrusive_ptr<ProcessGroupTpuDist> NewSubgroup(
      const c10::intrusive_ptr<c10d::Store>& parent_store, int global_rank,
      const std::vector<int>& global_ranks, Options options);

  const std::string getBackendName() const override { return "tpu_dist"; }

  // torch's split_group / ProcessGroup::splitGroup (process_group_options.cc):
  // a new group of the parent-group ranks `ranks` (in that order) over
  // `store` (torch's prefix store for the child), or null if this rank is not
  // in `ranks`. Collective over the members. `opts`: a BackendOptions (its
  // knobs), or c10d's base Options (this group's knobs); either way its
  // timeout and group_name (non-empty) are the child's.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
      const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  // A new BackendOptions holding the options this group was made with, its
  // current timeout and its group name.
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override;
  // torch.distributed.set_timeout: the default timeout of ops issued from
  // now on (ops already issued keep theirs). Thread-safe. REQUIRES: > 0.
  void setTimeout(std::chrono::milliseconds timeout) override;
  // torch names the group after construction; the flight recorder takes it.
  void setGroupUid(const std::string& pg_uid) override;
  // The group's flight recorder; null when off.
  const std::shared_ptr<FlightRecorder>& flight_recorder() const { return recorder_; }
  // The current default op timeout.
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(timeout_ms_.load(std::memory_order_relaxed));
  }
  const HostLayout& host_layout() const { return layout_; }
  // OK, or the error that poisoned the group.
  absl::Status status() const;

  // Thread-safe, from any thread: fails the op in flight promptly (within
  // milliseconds) and every later op with `cause` (prefixed with the op and
  // rank). REQUIRES: !cause.ok(). distributed::Job aborts every group of
  // the job this way when the job fails elsewhere.
  void Abort(const absl::Status& cause);
  // c10d's ProcessGroup::abort(): Abort(Aborted("abort() called")).
  void abort() override;
  // Stops the group's threads while the group lives on: the ops issued so
  // far run, then pending recvs are cancelled and the op threads leave. An
  // op that neither finishes nor makes progress for the group timeout (plus
  // a grace period) is aborted first. Ops issued afterwards run on the
  // calling thread (send/recv fail: cancelled). Returns whether both threads
  // left (on one of them, e.g. in a future callback, it only asks them to
  // and returns false). Idempotent; thread-safe. Called by c10d's shutdown()
  // (torch.distributed.destroy_process_group) and, for every live group the
  // Python binding made, by its interpreter-exit hook: a thread
  // still running when the interpreter finalizes dies in pthread_exit as it
  // takes the GIL to free a tensor, and the process with SIGABRT.
  bool StopThreads();
  void shutdown() override { StopThreads(); }
  // torch's Backend::get_error(): SUCCESS while the group is healthy, else
  // the class of the error that poisoned it (status()): TIMEOUT for an op
  // past its deadline, REMOTE_ERROR when a peer's connection or shm peer
  // was lost (UNAVAILABLE), COMM_ERROR otherwise (abort() here, a job error
  // passed to Abort, a mismatch). Gloo always says SUCCESS.
  c10d::ErrorType getError() override;

  // --- Reconfigure (issue 33; process_group_reconfigure.cc) ---------------
  // Re-forms the group as rank `rank` of `size` over `store` (a fresh prefix
  // per re-formation, as torchft makes one per quorum; the keys go under
  // "tpu_dist/<group_name>/g<k>/" of it as at construction), after an
  // Abort() or at any time: the op in flight and the queued ones fail
  // (Cancelled "reconfigured"), the old op threads are joined and the old
  // shm segments, TCP mesh and p2p connections closed, then new ones are
  // made. Collective over the new members, each calling it with the same
  // size. Counters (sequence numbers, p2p indices) restart; the flight
  // recorder is kept (a new one when the size changes); Options stay.
  // Throws c10::Error (and leaves the group unusable but for another
  // Reconfigure or destruction) when the rendezvous fails.
  // REQUIRES: no op call of this group concurrently; not from an op's
  // closure or a future callback of the group; 0 <= rank < size.
  void Reconfigure(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size);
#ifdef C10D_BACKEND_HAS_RECONFIGURE
  // torch's Backend reconfigure API over Reconfigure: the handle names this
  // group instance (unique per process and instance); reconfigure() takes
  // opts.handles as a vector (rank = position of this instance's handle)
  // or a set (ranks by sorted handle), the store this group was constructed
  // over, and the prefix opts.hints["store_prefix"] (default
  // "reconfigure/<uuid>"). Returns a completed Work.
  bool supportsReconfigure() const override { return true; }
  c10d::ReconfigureHandle get_reconfigure_handle() const override;
  c10::intrusive_ptr<c10d::Work> reconfigure(const c10d::ReconfigureOptions& opts) override;
#endif
  // --- end Reconfigure -----------------------------------------------------

  // Shapes: W = world size, [n...] = any shape with n elements per rank.
  // tensors: {[n...]}, in place; root's contents win.
  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  // tensors: {[n...]}, in place.
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  // tensors: {[n...]}, in place on root; other ranks' tensors unchanged.
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  // outputs: {W x [n...]}; inputs: {[n...]}.
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  // output: [W * n] (any shape with W * n elements); input: [n...], may be
  // the own slice of output.
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  // outputs: root {W x [n...]}, others {} ; inputs: {[n...]}.
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  // outputs: {[n...]}; inputs: root {W x [n...]}, others {}.
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  // outputs: {[n...]}; inputs: {W x [n...]}, inputs[r] reduced into rank r.
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts =
          c10d::ReduceScatterOptions()) override;
  // output: [n...]; input: [W * n] (rank r gets slice r), output may be the
  // own slice of input.
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts =
          c10d::ReduceScatterOptions()) override;
  // output: [rows_out, ...]; input: [rows_in, ...] (same trailing shape);
  // split sizes count dim-0 rows per peer, empty = even split.
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input,
      std::vector<int64_t>& output_split_sizes,
      std::vector<int64_t>& input_split_sizes,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  // outputs: W x [from peer r]; inputs: W x [to peer r]; any sizes, each
  // pair's byte counts must agree.
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  // Coalesced forms (process_group_coalesced_ops.cc): the member ops in
  // order, one Work that completes after the last. Shapes as the single op's
  // per member; tensors: {[n_i...]} in place.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts =
          c10d::AllreduceCoalescedOptions()) override;
  // output_lists[r][i]: [n_i...] from rank r; inputs[i]: [n_i...].
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  // outputs[i]: [W * n_i]; inputs[i]: [n_i...].
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  // outputs[i]: [n_i...]; inputs[i]: [W * n_i].
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  // torch.distributed.monitored_barrier (monitored_barrier.cc): blocking, on
  // the caller. Rank 0 waits for every rank's arrival until opts.timeout and
  // throws naming the first rank (or, with wait_all_ranks, every rank) that
  // did not arrive; the others wait for rank 0's release and throw if it
  // does not come. Messages as Gloo's, which torch's tests match.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  // Collectives issued so far on this rank; equal on every rank of a group
  // in sync.
  uint64_t getSequenceNumberForGroup() override;
  // tensors: {[n...]}; the matching recv must have the same byte size.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors,
                                      int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors,
                                      int src_rank, int tag) override;

 private:
  // The body of an op, run against the communicator (on the worker thread,
  // or on the issuer for an inline op).
  using OpBody = std::function<absl::Status(CollectiveBackend&, const OpContext&)>;
  // A non-owning reference to a body (a lambda, mutable or not), so an
  // inline op runs its body without copying it into an OpBody (a heap
  // closure). Valid while the referenced body lives.
  class BodyRef {
   public:
    template <typename F>
    static BodyRef To(F& f) {
      return BodyRef(const_cast<void*>(static_cast<const void*>(&f)),
                     [](void* o, CollectiveBackend& comm, const OpContext& ctx) {
                       return (*static_cast<F*>(o))(comm, ctx);
                     });
    }
    absl::Status operator()(CollectiveBackend& comm, const OpContext& ctx) const {
      return call_(obj_, comm, ctx);
    }

   private:
    using Call = absl::Status (*)(void*, CollectiveBackend&, const OpContext&);
    BodyRef(void* obj, Call call) : obj_(obj), call_(call) {}
    void* obj_;
    Call call_;
  };

  // Issues `body` and returns its Work; `outputs` are what the future
  // resolves to. `caller_waits` (c10d's !asyncOp) allows running a small op
  // inline on the calling thread when the queue is idle (RunInline: the body
  // runs in place, nothing allocated but the Work); otherwise it is queued
  // on the worker (EnqueueOnWorker). For the flight recorder: `inputs`
  // (empty: the op is in place, inputs are `outputs`), and the peer of a
  // recv. Called under issue_mu_, right after NextSeq() for a collective.
  template <typename Body>
  c10::intrusive_ptr<c10d::Work> Enqueue(const char* name, c10d::OpType type,
                                         std::chrono::milliseconds timeout,
                                         int64_t bytes, bool caller_waits,
                                         c10::ArrayRef<at::Tensor> outputs, Body body,
                                         c10::ArrayRef<at::Tensor> inputs = {},
                                         int peer = -1) ABSL_EXCLUSIVE_LOCKS_REQUIRED(issue_mu_) {
    c10::intrusive_ptr<c10d::Work> work = RunInline(name, type, timeout, bytes, caller_waits,
                                                    outputs, BodyRef::To(body), inputs, peer);
    if (work) return work;
    return EnqueueOnWorker(name, type, timeout, bytes, outputs, OpBody(std::move(body)), inputs,
                           peer);
  }
  // Runs the op on this thread and returns its (complete) Work if it may
  // run inline now; else returns null, having done nothing.
  c10::intrusive_ptr<c10d::Work> RunInline(const char* name, c10d::OpType type,
                                           std::chrono::milliseconds timeout, int64_t bytes,
                                           bool caller_waits, c10::ArrayRef<at::Tensor> outputs,
                                           BodyRef body, c10::ArrayRef<at::Tensor> inputs,
                                           int peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(issue_mu_);
  c10::intrusive_ptr<c10d::Work> EnqueueOnWorker(const char* name, c10d::OpType type,
                                                 std::chrono::milliseconds timeout,
                                                 int64_t bytes,
                                                 c10::ArrayRef<at::Tensor> outputs, OpBody body,
                                                 c10::ArrayRef<at::Tensor> inputs, int peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(issue_mu_);
  // Whether the flight recorder records ops of `type` (a coalesced op's
  // completion marker is not an op).
  bool FrRecords(c10d::OpType type) const;
  // Flight-recorder hooks (no-ops when it is off). FrRecord records an op as
  // scheduled (seq: its collective sequence number; peer >= 0: a send to /
  // recv from that group rank) and returns its id; FrFinished marks it ended
  // and, on the group's first failure, dumps and asks every rank to dump.
  // started_at_ns > 0: recorded as started then too (an inline op).
  uint64_t FrRecord(const char* name, c10d::OpType type, uint64_t seq,
                    std::chrono::milliseconds timeout, c10::ArrayRef<at::Tensor> inputs,
                    c10::ArrayRef<at::Tensor> outputs, int peer,
                    int64_t started_at_ns = 0);
  void FrFinished(uint64_t id, const absl::Status& status);
  // Runs `body` against the backend (started at `start`) and returns its
  // status (a thrown exception poisons the group); `while_waiting` (may be
  // null) goes to the backend in OpContext. On the thread that runs the op:
  // the worker, or the issuer for an inline op.
  absl::Status RunBody(const char* name, std::chrono::milliseconds timeout, int64_t bytes,
                       absl::Time start, BodyRef body, WaitHook* while_waiting);
  std::chrono::milliseconds OpTimeout(std::chrono::milliseconds requested) const;
  // Construction / Reconfigure: the flight recorder for rank_ of size_, and
  // the connections over a new generation of `store` (process_group_tpu_dist.cc).
  void MakeFlightRecorder();
  void Connect(const c10::intrusive_ptr<c10d::Store>& store);
  // Reconfigure's teardown: fails what is in flight with `cause`, joins the
  // op threads, closes p2p, shm and TCP (process_group_reconfigure.cc).
  void Disconnect(const absl::Status& cause);
  // A Work that completes, on the worker, after every op issued before it,
  // failing if the group is poisoned by then; its result is `outputs`.
  c10::intrusive_ptr<c10d::Work> CompleteAfterIssued(const char* name, c10d::OpType type,
                                                     std::chrono::milliseconds timeout,
                                                     bool caller_waits,
                                                     std::vector<at::Tensor> outputs) ABSL_LOCKS_EXCLUDED(issue_mu_);
  uint32_t NextSeq() ABSL_EXCLUSIVE_LOCKS_REQUIRED(issue_mu_) { return ++op_seq_; }
  // Per-(peer, tag) message counter for send/recv keys.
  int64_t NextP2pIndex(const std::string& channel) ABSL_EXCLUSIVE_LOCKS_REQUIRED(issue_mu_);
  // Whether send/recv with `peer` go through shm_p2p_ (same host) rather
  // than p2p_ (TCP).
  bool OnMyHost(int peer) const {
    return shm_p2p_ != nullptr && layout_.host_of_rank[peer] == layout_.host_of_rank[rank_];
  }

  Options options_;  // as constructed; the timeout in force is timeout_ms_
  c10::intrusive_ptr<c10d::Store> base_store_;  // as constructed: reconfigure()'s
  // Why the group has no connections (a failed Reconfigure); OK otherwise.
  absl::Status disconnected_;
  std::atomic<int64_t> timeout_ms_;  // setTimeout
  c10::intrusive_ptr<c10d::Store> store_;  // namespaced by group name and generation
  // store_->clone(), made at the first recv: recvs wait on it, so that a
  // waiting recv never holds the connection sends use.
  c10::intrusive_ptr<c10d::Store> p2p_store_ ABSL_GUARDED_BY(issue_mu_);
  HostLayout layout_;
  std::unique_ptr<CollectiveBackend> backend_;  // shm, or hierarchical
  uint32_t op_seq_ ABSL_GUARDED_BY(issue_mu_) = 0;  // collectives issued
  int64_t monitored_barrier_seq_ ABSL_GUARDED_BY(issue_mu_) = 0;
  // Held while an op is issued (sequence number, p2p message index, queueing;
  // an inline op runs under it).
  absl::Mutex issue_mu_;
  std::map<std::string, int64_t> p2p_counters_ ABSL_GUARDED_BY(issue_mu_);
  // send/recv connections; null with Options::p2p_over_store. Outlives
  // p2p_worker_ (the destructor resets it last).
  std::unique_ptr<tcp::TcpP2p> p2p_;
  // send/recv among this host's ranks; null without Options::shm_p2p (or
  // with p2p_over_store). Uses backend_'s communicator: reset before it.
  std::unique_ptr<shm::ShmP2p> shm_p2p_;
  // Null when Options::flight_recorder_entries == 0.
  std::shared_ptr<FlightRecorder> recorder_;
  std::unique_ptr<FlightRecorderWatcher> fr_watcher_;  // polls for dump requests
  std::atomic<uint64_t> fr_p2p_seq_{0};                // send/recv recorded
  std::atomic<bool> fr_desc_synced_{false};  // torch's group desc taken
  std::atomic<bool> fr_failure_dumped_{false};
  std::unique_ptr<OpWorker> p2p_worker_;      // recv waits; joined after worker_
  std::unique_ptr<OpWorker> worker_;          // last: joined first
};

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_PROCESS_GROUP_TPU_DIST_H_
