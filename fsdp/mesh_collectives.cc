#include "fsdp/mesh_collectives.h"

#include <exception>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/exception_message.h"
#include "fsdp/shard_math.h"

namespace tpudist::fsdp {
namespace {

// Runs one collective and waits for it with the mesh's deadline.
absl::Status Run(const char* op, const DeviceMesh& mesh, int mesh_dim, const at::Tensor& t,
                 const std::function<c10::intrusive_ptr<c10d::Work>()>& issue) {
  const absl::Time start = absl::Now();
  try {
    c10::intrusive_ptr<c10d::Work> work = issue();
    if (!work->wait(mesh.collective_timeout_ms())) {
      return absl::DeadlineExceededError("wait returned false");
    }
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(
        op, " on rank ", mesh.global_rank(), " along mesh dim ", mesh_dim, " (group of ",
        mesh.size(mesh_dim), ", ", t.numel() * t.element_size(), " bytes) failed after ",
        absl::FormatDuration(absl::Now() - start), " (timeout ",
        absl::FormatDuration(mesh.collective_timeout()), "): ", ::tpudist::collectives::ExceptionMessage(e)));
  }
}

c10d::ReduceOp ToC10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::SUM;  // avg = sum, then divide
  }
}

// `t` zero-padded along `dim` to `size` elements; contiguous.
at::Tensor PadTo(const at::Tensor& t, int64_t dim, int64_t size) {
  if (t.size(dim) == size) return t.contiguous();
  std::vector<int64_t> shape = t.sizes().vec();
  shape[dim] = size;
  at::Tensor out = at::zeros(shape, t.options());
  out.narrow(dim, 0, t.size(dim)).copy_(t);
  return out;
}

// A new TensorImpl over the buffer a Work still references. Callers attach
// autograd history to results; if that history (which holds the mesh and
// so the process group) hung off the Work's own tensor, the backend's worker
// thread could end up dropping the last reference to its group.
at::Tensor Detached(const at::Tensor& buffer) { return buffer.alias(); }

}  // namespace

absl::StatusOr<at::Tensor> AllGatherAlongDim(const DeviceMesh& mesh, int mesh_dim,
                                             const at::Tensor& local, int64_t tensor_dim,
                                             int64_t logical_size) {
  const int64_t n = mesh.size(mesh_dim);
  const int64_t full = PaddedChunkSize(logical_size, n);
  std::vector<at::Tensor> inputs = {PadTo(local, tensor_dim, full)};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int64_t i = 0; i < n; ++i) outputs[0].push_back(at::empty_like(inputs[0]));
  c10d::AllgatherOptions opts;
  opts.asyncOp = false;  // Run waits at once
  absl::Status s = Run("all_gather", mesh, mesh_dim, inputs[0], [&] {
    return mesh.Group(mesh_dim)->allgather(outputs, inputs, opts);
  });
  if (!s.ok()) return s;
  return at::cat(outputs[0], tensor_dim).narrow(tensor_dim, 0, logical_size).contiguous();
}

absl::StatusOr<at::Tensor> AllReduceAlongDim(const DeviceMesh& mesh, int mesh_dim,
                                             const at::Tensor& local, ReduceOp op) {
  std::vector<at::Tensor> tensors = {local.contiguous().clone()};
  c10d::AllreduceOptions opts;
  opts.reduceOp = ToC10d(op);
  opts.asyncOp = false;
  absl::Status s = Run("all_reduce", mesh, mesh_dim, tensors[0], [&] {
    return mesh.Group(mesh_dim)->allreduce(tensors, opts);
  });
  if (!s.ok()) return s;
  if (op == ReduceOp::kAvg) tensors[0].div_(mesh.size(mesh_dim));
  return Detached(tensors[0]);
}

absl::StatusOr<at::Tensor> ReduceScatterAlongDim(const DeviceMesh& mesh, int mesh_dim,
                                                 const at::Tensor& local, int64_t tensor_dim,
                                                 ReduceOp op) {
  const int64_t n = mesh.size(mesh_dim);
  const int64_t logical = local.size(tensor_dim);
  const int64_t full = PaddedChunkSize(logical, n);
  const at::Tensor padded = PadTo(local, tensor_dim, full * n);
  std::vector<std::vector<at::Tensor>> inputs(1);
  for (int64_t i = 0; i < n; ++i) {
    inputs[0].push_back(padded.narrow(tensor_dim, i * full, full).contiguous());
  }
  std::vector<at::Tensor> outputs = {at::empty_like(inputs[0][0])};
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = ToC10d(op);
  opts.asyncOp = false;
  absl::Status s = Run("reduce_scatter", mesh, mesh_dim, padded, [&] {
    return mesh.Group(mesh_dim)->reduce_scatter(outputs, inputs, opts);
  });
  if (!s.ok()) return s;
  if (op == ReduceOp::kAvg) outputs[0].div_(n);
  const ChunkExtent mine = ChunkOf(logical, n, mesh.LocalRank(mesh_dim));
  return outputs[0].narrow(tensor_dim, 0, mine.size).contiguous();
}

absl::StatusOr<at::Tensor> AllToAllAlongDim(const DeviceMesh& mesh, int mesh_dim,
                                            const at::Tensor& local, int64_t from_dim,
                                            int64_t from_logical_size, int64_t to_dim) {
  const int64_t n = mesh.size(mesh_dim);
  const int64_t from_full = PaddedChunkSize(from_logical_size, n);
  const int64_t to_logical = local.size(to_dim);
  const int64_t to_full = PaddedChunkSize(to_logical, n);
  const at::Tensor padded = PadTo(PadTo(local, from_dim, from_full), to_dim, to_full * n);
  // Piece j (this rank's from-chunk of rank j's to-chunk) goes to rank j.
  std::vector<at::Tensor> pieces;
  for (int64_t j = 0; j < n; ++j) pieces.push_back(padded.narrow(to_dim, j * to_full, to_full));
  at::Tensor input = at::stack(pieces, 0).contiguous();  // [n, ...piece]
  at::Tensor output = at::empty_like(input);
  std::vector<int64_t> no_splits;
  c10d::AllToAllOptions opts;
  opts.asyncOp = false;
  absl::Status s = Run("all_to_all", mesh, mesh_dim, input, [&] {
    return mesh.Group(mesh_dim)->alltoall_base(output, input, no_splits, no_splits, opts);
  });
  if (!s.ok()) return s;
  std::vector<at::Tensor> received;
  for (int64_t j = 0; j < n; ++j) received.push_back(output.select(0, j));
  const ChunkExtent mine = ChunkOf(to_logical, n, mesh.LocalRank(mesh_dim));
  return at::cat(received, from_dim)
      .narrow(from_dim, 0, from_logical_size)
      .narrow(to_dim, 0, mine.size)
      .contiguous();
}

absl::StatusOr<at::Tensor> BroadcastAlongDim(const DeviceMesh& mesh, int mesh_dim,
                                             const at::Tensor& local, int64_t root) {
  std::vector<at::Tensor> tensors = {local.contiguous().clone()};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.asyncOp = false;
  absl::Status s = Run("broadcast", mesh, mesh_dim, tensors[0], [&] {
    return mesh.Group(mesh_dim)->broadcast(tensors, opts);
  });
  if (!s.ok()) return s;
  return Detached(tensors[0]);
}

}  // namespace tpudist::fsdp
