// The gather / scatter family of ProcessGroupTpuDist: allgather,
// _allgather_base, gather, scatter, reduce_scatter, _reduce_scatter_base,
// alltoall, alltoall_base. Each validates its local arguments on the calling
// thread (throwing like Gloo), then queues a body that maps the tensors to
// contiguous byte buffers and calls the shm algorithm.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "collectives/core/chunking.h"
#include "collectives/process_group_tpu_dist.h"
#include "collectives/shm/algorithms.h"
#include "collectives/tensor_bridge.h"

namespace tpudist::collectives {
namespace {

template <typename T>
T ValueOrThrow(absl::StatusOr<T> v) {
  ThrowIfError(v.status());
  return *std::move(v);
}

// Checks that `list` has `n` tensors matching `like` in dtype and numel.
void CheckList(const char* op, const std::vector<at::Tensor>& list, size_t n,
               const at::Tensor& like) {
  TORCH_CHECK(list.size() == n, "tpu_dist: ", op, " expects ", n,
              " tensors in the list, got ", list.size());
  for (const at::Tensor& t : list) {
    TORCH_CHECK(t.scalar_type() == like.scalar_type(), "tpu_dist: ", op,
                ": dtype ", t.scalar_type(), " differs from ", like.scalar_type());
    TORCH_CHECK(t.numel() == like.numel(), "tpu_dist: ", op, ": numel ",
                t.numel(), " differs from ", like.numel());
  }
}

// Contiguous buffers for `list` (each [like.sizes()]) and their data pointers.
struct Buffers {
  std::vector<at::Tensor> tensors;
  std::vector<void*> ptrs;
  explicit Buffers(const std::vector<at::Tensor>& list) {
    for (const at::Tensor& t : list) {
      tensors.push_back(ContiguousBuffer(t));
      ptrs.push_back(tensors.back().data_ptr());
    }
  }
  std::vector<const void*> const_ptrs() const {
    return std::vector<const void*>(ptrs.begin(), ptrs.end());
  }
  void CopyBack(std::vector<at::Tensor>& list) const {
    for (size_t i = 0; i < list.size(); ++i) CopyBackIfNeeded(list[i], tensors[i]);
  }
};

// Pointers to `n` consecutive pieces of `bytes` bytes starting at `base`.
std::vector<void*> Pieces(void* base, int n, int64_t bytes) {
  std::vector<void*> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<char*>(base) + i * bytes;
  return v;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1,
              "tpu_dist: allgather takes one input and one output list");
  at::Tensor in = inputs[0];
  const DataType dtype = ValueOrThrow(ToDataType(in.scalar_type(), "allgather"));
  CheckList("allgather", outputs[0], size_, in);
  std::vector<at::Tensor> outs = outputs[0];
  absl::MutexLock lock(&issue_mu_);
  const uint32_t seq = NextSeq();
  return Enqueue("allgather", c10d::OpType::ALLGATHER, OpTimeout(opts.timeout),
                 in.nbytes(), !opts.asyncOp, outs,
                 [in, outs, dtype, seq](CollectiveBackend& comm,
                                        const OpContext& ctx) mutable {
                   at::Tensor src = ContiguousBuffer(in);  // [in.sizes()]
                   Buffers dst(outs);                      // size x [in.sizes()]
                   OpSpec spec{ctx, seq, dtype, ShapeOf(in), in.numel()};
                   absl::Status s = comm.AllGather(spec, src.data_ptr(),
                                                   src.nbytes(), dst.ptrs);
                   if (s.ok()) dst.CopyBack(outs);
                   return s;
                 },
                 /*inputs=*/{in});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  const DataType dtype =
      ValueOrThrow(ToDataType(input.scalar_type(), "_allgather_base"));
  TORCH_CHECK(output.scalar_type() == input.scalar_type() &&
                  output.numel() == input.numel() * size_,
              "tpu_dist: _allgather_base: output must hold world_size x input "
              "elements of the input dtype");
  at::Tensor out = output, in = input;
  absl::MutexLock lock(&issue_mu_);
  const uint32_t seq = NextSeq();
  return Enqueue("_allgather_base", c10d::OpType::_ALLGATHER_BASE,
                 OpTimeout(opts.timeout), in.nbytes(), !opts.asyncOp, {out},
                 [in, out, dtype, seq, this](CollectiveBackend& comm,
                                             const OpContext& ctx) mutable {
                   at::Tensor src = ContiguousBuffer(in);   // [n]
                   at::Tensor dst = ContiguousBuffer(out);  // [size * n]
                   OpSpec spec{ctx, seq, dtype, ShapeOf(in), in.numel()};
                   absl::Status s = comm.AllGather(spec, src.data_ptr(), src.nbytes(),
                       Pieces(dst.data_ptr(), size_, src.nbytes()));
                   if (s.ok()) CopyBackIfNeeded(out, dst);
                   return s;
                 },
                 /*inputs=*/{in});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  TORCH_CHECK(inputs.size() == 1, "tpu_dist: gather takes exactly one input");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_,
              "tpu_dist: gather root ", opts.rootRank, " out of range");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor in = inputs[0];
  const DataType dtype = ValueOrThrow(ToDataType(in.scalar_type(), "gather"));
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1, "tpu_dist: gather root needs one output list");
    CheckList("gather", outputs[0], size_, in);
    outs = outputs[0];
  }
  absl::MutexLock lock(&issue_mu_);
  const uint32_t seq = NextSeq();
  return Enqueue("gather", c10d::OpType::GATHER, OpTimeout(opts.timeout),
                 in.nbytes(), !opts.asyncOp, outs,
                 [in, outs, dtype, root, seq](CollectiveBackend& comm,
                                              const OpContext& ctx) mutable {
                   at::Tensor src = ContiguousBuffer(in);
                   Buffers dst(outs);  // root: size x [in.sizes()]; else empty
                   OpSpec spec{ctx, seq, dtype, ShapeOf(in), in.numel()};
                   absl::Status s = comm.Gather(spec, root, src.data_ptr(),
                                                src.nbytes(), dst.ptrs);
                   if (s.ok()) dst.CopyBack(outs);
                   return s;
                 },
                 /*inputs=*/{in});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1, "tpu_dist: scatter takes exactly one output");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_,
              "tpu_dist: scatter root ", opts.rootRank, " out of range");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor out = outputs[0];
  const DataType dtype = ValueOrThrow(ToDataType(out.scalar_type(), "scatter"));
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1, "tpu_dist: scatter root needs one input list");
    CheckList("scatter", inputs[0], size_, out);
    ins = inputs[0];
  }
  absl::MutexLock lock(&issue_mu_);
  const uint32_t seq = NextSeq();
  return Enqueue("scatter", c10d::OpType::SCATTER, OpTimeout(opts.timeout),
                 out.nbytes(), !opts.asyncOp, {out},
                 [ins, out, dtype, root, seq](CollectiveBackend& comm,
                                              const OpContext& ctx) mutable {
                   Buffers src(ins);                        // root: size x [out.sizes()]
                   at::Tensor dst = ContiguousBuffer(out);  // [out.sizes()]
                   OpSpec spec{ctx, seq, dtype, ShapeOf(out), out.numel()};
                   absl::Status s = comm.Scatter(spec, root, src.const_ptrs(),
                                                 dst.data_ptr(), dst.nbytes());
                   if (s.ok()) CopyBackIfNeeded(out, dst);
                   return s;
                 },
                 /*inputs=*/ins);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1,
              "tpu_dist: reduce_scatter takes one output and one input list");
  at::Tensor out = outputs[0];
  const DataType dtype =
      ValueOrThrow(ToDataType(out.scalar_type(), "reduce_scatter"));
  const ReduceKind kind = ValueOrThrow(ToReduceKind(opts.reduceOp, dtype));
  ThrowIfError(CheckReducible(dtype, kind));
  CheckList("reduce_scatter", inputs[0], size_, out);
  std::vector<at::Tensor> ins = inputs[0];
  absl::MutexLock lock(&issue_mu_);
  const uint32_t seq = NextSeq();
  return Enqueue("reduce_scatter", c10d::OpType::REDUCE_SCATTER,
                 OpTimeout(opts.timeout), out.nbytes() * size_, !opts.asyncOp, {out},
                 [ins, out, dtype, kind, seq](CollectiveBackend& comm,
                                              const OpContext& ctx) mutable {
                   Buffers src(ins);                        // size x [out.sizes()]
                   at::Tensor dst = ContiguousBuffer(out);  // [out.sizes()]
                   OpSpec spec{ctx, seq, dtype, ShapeOf(out), out.numel()};
                   absl::Status s = comm.ReduceScatter(spec, kind,
                                                       src.const_ptrs(), dst.data_ptr());
                   if (s.ok()) CopyBackIfNeeded(out, dst);
                   return s;
                 },
                 /*inputs=*/ins);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const DataType dtype =
      ValueOrThrow(ToDataType(output.scalar_type(), "_reduce_scatter_base"));
  const ReduceKind kind = ValueOrThrow(ToReduceKind(opts.reduceOp, dtype));
  ThrowIfError(CheckReducible(dtype, kind));
  TORCH_CHECK(output.scalar_type() == input.scalar_type() &&
                  input.numel() == output.numel() * size_,
              "tpu_dist: _reduce_scatter_base: input must hold world_size x "
              "output elements of the output dtype");
  at::Tensor out = output, in = input;
  absl::MutexLock lock(&issue_mu_);
  const uint32_t seq = NextSeq();
  return Enqueue("_reduce_scatter_base", c10d::OpType::_REDUCE_SCATTER_BASE,
                 OpTimeout(opts.timeout), in.nbytes(), !opts.asyncOp, {out},
                 [in, out, dtype, kind, seq, this](CollectiveBackend& comm,
                                                   const OpContext& ctx) mutable {
                   at::Tensor src = ContiguousBuffer(in);   // [size * n]
                   at::Tensor dst = ContiguousBuffer(out);  // [n]
                   std::vector<void*> pieces = Pieces(src.data_ptr(), size_, dst.nbytes());
                   OpSpec spec{ctx, seq, dtype, ShapeOf(out), out.numel()};
                   absl::Status s = comm.ReduceScatter(spec, kind,
                       std::vector<const void*>(pieces.begin(), pieces.end()),
                       dst.data_ptr());
                   if (s.ok()) CopyBackIfNeeded(out, dst);
                   return s;
                 },
                 /*inputs=*/{in});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  const DataType dtype =
      ValueOrThrow(ToDataType(input.scalar_type(), "alltoall_base"));
  TORCH_CHECK(output.scalar_type() == input.scalar_type() && input.dim() >= 1 &&
                  output.dim() >= 1,
              "tpu_dist: alltoall_base needs same-dtype tensors of rank >= 1");
  const int64_t in_row = input.size(0) ? input.numel() / input.size(0)
                                       : c10::multiply_integers(input.sizes().slice(1));
  const int64_t out_row = output.size(0) ? output.numel() / output.size(0)
                                         : c10::multiply_integers(output.sizes().slice(1));
  TORCH_CHECK(in_row == out_row, "tpu_dist: alltoall_base: input rows have ",
              in_row, " elements, output rows ", out_row);
  const std::vector<int64_t> in_rows = ValueOrThrow(
      ResolveSplits(input_split_sizes, input.size(0), size_, "input"));
  const std::vector<int64_t> out_rows = ValueOrThrow(
      ResolveSplits(output_split_sizes, output.size(0), size_, "output"));
  const int64_t row_bytes = in_row * static_cast<int64_t>(input.element_size());
  at::Tensor out = output, in = input;
  absl::MutexLock lock(&issue_mu_);
  const uint32_t seq = NextSeq();
  return Enqueue(
      "alltoall_base", c10d::OpType::ALLTOALL_BASE, OpTimeout(opts.timeout),
      in.nbytes(), !opts.asyncOp, {out},
      [in, out, dtype, seq, in_rows, out_rows, row_bytes](
          CollectiveBackend& comm, const OpContext& ctx) mutable {
        at::Tensor src = ContiguousBuffer(in);   // [rows_in, ...]
        at::Tensor dst = ContiguousBuffer(out);  // [rows_out, ...]
        const int world = comm.size();
        std::vector<int64_t> in_bytes(world), out_bytes(world);
        std::vector<const void*> ins(world);
        std::vector<void*> outs(world);
        const std::vector<int64_t> in_off = ExclusiveOffsets(in_rows);
        const std::vector<int64_t> out_off = ExclusiveOffsets(out_rows);
        for (int r = 0; r < world; ++r) {
          in_bytes[r] = in_rows[r] * row_bytes;
          out_bytes[r] = out_rows[r] * row_bytes;
          ins[r] = static_cast<const char*>(src.data_ptr()) + in_off[r] * row_bytes;
          outs[r] = static_cast<char*>(dst.data_ptr()) + out_off[r] * row_bytes;
        }
        OpSpec spec{ctx, seq, dtype, ShapeOf(in), in.numel()};
        absl::Status s = comm.AllToAll(spec, ins, in_bytes, outs, out_bytes);
        if (s.ok()) CopyBackIfNeeded(out, dst);
        return s;
      },
      /*inputs=*/{in});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::alltoall(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_ &&
                  static_cast<int>(inputs.size()) == size_,
              "tpu_dist: alltoall takes world_size inputs and outputs");
  const DataType dtype =
      ValueOrThrow(ToDataType(inputs[0].scalar_type(), "alltoall"));
  for (int r = 0; r < size_; ++r) {
    TORCH_CHECK(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                    outputs[r].scalar_type() == inputs[0].scalar_type(),
                "tpu_dist: alltoall tensors must share one dtype");
  }
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  absl::MutexLock lock(&issue_mu_);
  const uint32_t seq = NextSeq();
  return Enqueue("alltoall", c10d::OpType::ALLTOALL, OpTimeout(opts.timeout), 0, !opts.asyncOp, outs,
                 [ins, outs, dtype, seq](CollectiveBackend& comm,
                                         const OpContext& ctx) mutable {
                   Buffers src(ins), dst(outs);  // size x [per-peer shapes]
                   const int world = comm.size();
                   std::vector<int64_t> in_bytes(world), out_bytes(world);
                   for (int r = 0; r < world; ++r) {
                     in_bytes[r] = src.tensors[r].nbytes();
                     out_bytes[r] = dst.tensors[r].nbytes();
                   }
                   OpSpec spec{ctx, seq, dtype, {}, 0};
                   absl::Status s = comm.AllToAll(spec, src.const_ptrs(),
                                                  in_bytes, dst.ptrs, out_bytes);
                   if (s.ok()) dst.CopyBack(outs);
                   return s;
                 },
                 /*inputs=*/ins);
}

}  // namespace tpudist::collectives
