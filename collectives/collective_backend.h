// CollectiveBackend: the raw-byte collectives a ProcessGroupTpuDist op body
// runs against, so the group's ops are written once for both paths:
//   * ShmBackend (this file): all ranks on one host; forwards to the
//     shared-memory algorithms of collectives/shm over one Communicator.
//   * HierarchicalBackend (hierarchical_backend.h): ranks on several hosts;
//     shm inside each host, TCP between hosts.
//
// Every method is collective over the group (all ranks call it in the same
// order with consistent arguments), uses group ranks, returns by
// spec.ctx.deadline(), and on any error poisons the backend: later calls fail
// fast with the first error. The op types (OpSpec, ReduceKind, DataType) are
// collectives/core's; argument conventions are those of
// collectives/shm/algorithms.h (pointers to caller-owned host memory).
//
// Thread-safety: one op at a time (the group's worker thread, or an inline
// op under the worker's busy flag); poison_status() and Abort() from any thread.
#ifndef TPU_DIST_COLLECTIVES_COLLECTIVE_BACKEND_H_
#define TPU_DIST_COLLECTIVES_COLLECTIVE_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "collectives/core/op_header.h"
#include "collectives/core/reduce_kernels.h"
#include "collectives/shm/communicator.h"

namespace tpudist::collectives {

class CollectiveBackend {
 public:
  virtual ~CollectiveBackend() = default;

  virtual int size() const = 0;
  // data: [count] in place.
  virtual absl::Status AllReduce(const OpSpec& spec, ReduceKind op,
                                 void* data) = 0;
  // data: [count]; in place on root, unchanged elsewhere.
  virtual absl::Status Reduce(const OpSpec& spec, ReduceKind op,
                              int root, void* data) = 0;
  // inputs: size() x [count]; out: [count].
  virtual absl::Status ReduceScatter(const OpSpec& spec, ReduceKind op,
                                     absl::Span<const void* const> inputs,
                                     void* out) = 0;
  // in: `bytes`; outs: size() x `bytes`; `in` may alias outs[rank].
  virtual absl::Status AllGather(const OpSpec& spec, const void* in,
                                 int64_t bytes, absl::Span<void* const> outs) = 0;
  virtual absl::Status Broadcast(const OpSpec& spec, int root, void* data,
                                 int64_t bytes) = 0;
  // outs: size() x `bytes` on root, ignored elsewhere.
  virtual absl::Status Gather(const OpSpec& spec, int root, const void* in,
                              int64_t bytes, absl::Span<void* const> outs) = 0;
  // ins: size() x `bytes` on root, ignored elsewhere.
  virtual absl::Status Scatter(const OpSpec& spec, int root,
                               absl::Span<const void* const> ins, void* out,
                               int64_t bytes) = 0;
  // ins[r]: in_bytes[r] bytes to rank r; outs[r]: out_bytes[r] from rank r.
  virtual absl::Status AllToAll(const OpSpec& spec,
                                absl::Span<const void* const> ins,
                                absl::Span<const int64_t> in_bytes,
                                absl::Span<void* const> outs,
                                absl::Span<const int64_t> out_bytes) = 0;
  virtual absl::Status Barrier(const OpSpec& spec) = 0;

  // Poisons with `status` (the first poison wins) and returns the poison.
  virtual absl::Status Poison(absl::Status status) = 0;
  // OK, or the status that poisoned this backend. Thread-safe.
  virtual absl::Status poison_status() const = 0;
  // Thread-safe, from any thread: poisons the backend with `status` and
  // makes the op in flight fail promptly (shm waits notice within a futex
  // slice, TCP sockets are shut down). REQUIRES: !status.ok().
  virtual void Abort(const absl::Status& status) = 0;
  // The shm communicator of this rank's host (its ranks, local numbering),
  // for point-to-point over its rings (shm/p2p.h); null if none. Owned by
  // the backend; valid for its lifetime.
  virtual shm::Communicator* local_communicator() const { return nullptr; }
  // True if every wait of an op for a peer first runs the op's
  // OpContext::while_waiting; an issuer whose bookkeeping must exist before
  // the op can block (a flight-recorder entry) runs it up front otherwise.
  virtual bool RunsWaitHooks() const { return false; }
};

// The single-host backend. Owns its communicator.
class ShmBackend final : public CollectiveBackend {
 public:
  // small_allreduce_bytes: one-shot allreduce limit (shm::AllReduce).
  ShmBackend(std::unique_ptr<shm::Communicator> comm, int64_t small_allreduce_bytes);

  int size() const override { return comm_->size(); }
  // shm::Communicator's waits run it (WaitAllPublished, WaitPeerPublished).
  bool RunsWaitHooks() const override { return true; }
  absl::Status AllReduce(const OpSpec& spec, ReduceKind op, void* data) override;
  absl::Status Reduce(const OpSpec& spec, ReduceKind op, int root,
                      void* data) override;
  absl::Status ReduceScatter(const OpSpec& spec, ReduceKind op,
                             absl::Span<const void* const> inputs, void* out) override;
  absl::Status AllGather(const OpSpec& spec, const void* in, int64_t bytes,
                         absl::Span<void* const> outs) override;
  absl::Status Broadcast(const OpSpec& spec, int root, void* data,
                         int64_t bytes) override;
  absl::Status Gather(const OpSpec& spec, int root, const void* in, int64_t bytes,
                      absl::Span<void* const> outs) override;
  absl::Status Scatter(const OpSpec& spec, int root, absl::Span<const void* const> ins,
                       void* out, int64_t bytes) override;
  absl::Status AllToAll(const OpSpec& spec, absl::Span<const void* const> ins,
                        absl::Span<const int64_t> in_bytes, absl::Span<void* const> outs,
                        absl::Span<const int64_t> out_bytes) override;
  absl::Status Barrier(const OpSpec& spec) override;
  absl::Status Poison(absl::Status status) override;
  absl::Status poison_status() const override;
  void Abort(const absl::Status& status) override;
  shm::Communicator* local_communicator() const override { return comm_.get(); }

 private:
  // Mirrors the communicator's poison for readers on other threads.
  absl::Status Track(absl::Status s);

  std::unique_ptr<shm::Communicator> comm_;
  const int64_t small_allreduce_bytes_;
  mutable absl::Mutex mu_;
  absl::Status poison_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tpudist::collectives

#endif  // TPU_DIST_COLLECTIVES_COLLECTIVE_BACKEND_H_
