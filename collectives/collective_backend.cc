#include "collectives/collective_backend.h"

#include <utility>

#include "collectives/shm/algorithms.h"

namespace tpudist::collectives {

ShmBackend::ShmBackend(std::unique_ptr<shm::Communicator> comm,
                       int64_t small_allreduce_bytes)
    : comm_(std::move(comm)), small_allreduce_bytes_(small_allreduce_bytes) {}

absl::Status ShmBackend::Track(absl::Status s) {
  if (!s.ok() && !comm_->poison_status().ok()) {
    absl::MutexLock lock(&mu_);
    if (poison_.ok()) poison_ = comm_->poison_status();
  }
  return s;
}

absl::Status ShmBackend::AllReduce(const OpSpec& spec, ReduceKind op,
                                   void* data) {
  return Track(shm::AllReduce(*comm_, spec, op, data, small_allreduce_bytes_));
}

absl::Status ShmBackend::Reduce(const OpSpec& spec, ReduceKind op, int root,
                                void* data) {
  return Track(shm::Reduce(*comm_, spec, op, root, data));
}

absl::Status ShmBackend::ReduceScatter(const OpSpec& spec, ReduceKind op,
                                       absl::Span<const void* const> inputs, void* out) {
  return Track(shm::ReduceScatter(*comm_, spec, op, inputs, out));
}

absl::Status ShmBackend::AllGather(const OpSpec& spec, const void* in, int64_t bytes,
                                   absl::Span<void* const> outs) {
  return Track(shm::AllGather(*comm_, spec, in, bytes, outs));
}

absl::Status ShmBackend::Broadcast(const OpSpec& spec, int root, void* data,
                                   int64_t bytes) {
  return Track(shm::Broadcast(*comm_, spec, root, data, bytes));
}

absl::Status ShmBackend::Gather(const OpSpec& spec, int root, const void* in,
                                int64_t bytes, absl::Span<void* const> outs) {
  return Track(shm::Gather(*comm_, spec, root, in, bytes, outs));
}

absl::Status ShmBackend::Scatter(const OpSpec& spec, int root,
                                 absl::Span<const void* const> ins, void* out,
                                 int64_t bytes) {
  return Track(shm::Scatter(*comm_, spec, root, ins, out, bytes));
}

absl::Status ShmBackend::AllToAll(const OpSpec& spec,
                                  absl::Span<const void* const> ins,
                                  absl::Span<const int64_t> in_bytes,
                                  absl::Span<void* const> outs,
                                  absl::Span<const int64_t> out_bytes) {
  return Track(shm::AllToAll(*comm_, spec, ins, in_bytes, outs, out_bytes));
}

absl::Status ShmBackend::Barrier(const OpSpec& spec) {
  return Track(shm::Barrier(*comm_, spec));
}

absl::Status ShmBackend::Poison(absl::Status status) {
  return Track(comm_->Poison(std::move(status)));
}

void ShmBackend::Abort(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (poison_.ok()) poison_ = status;
  }
  comm_->RequestAbort(status);
}

absl::Status ShmBackend::poison_status() const {
  absl::MutexLock lock(&mu_);
  return poison_;
}

}  // namespace tpudist::collectives
