#include "fsdp/fully_shard/flat_buffer.h"

#include <c10/util/Exception.h>

namespace tpudist::fsdp {

at::Tensor MakeFlatShard(absl::Span<const at::Tensor> full, const FlatParamLayout& layout,
                         int64_t rank, at::ScalarType dtype) {
  TORCH_CHECK(full.size() == layout.entries.size(), "MakeFlatShard: ", full.size(),
              " tensors for ", layout.entries.size(), " entries");
  at::Tensor flat = at::zeros({layout.shard_numel}, at::TensorOptions().dtype(dtype));
  for (size_t i = 0; i < full.size(); ++i) {
    const ChunkExtent rows = ShardRows(layout.entries[i], layout.world_size, rank);
    if (rows.size == 0) continue;
    ShardView(flat, layout, i, rank).copy_(full[i].narrow(0, rows.offset, rows.size));
  }
  return flat;
}

at::Tensor ShardView(const at::Tensor& flat, const FlatParamLayout& layout, size_t i, int64_t rank) {
  const FlatParamEntry& e = layout.entries[i];
  const std::vector<int64_t> shape = ShardShape(e, layout.world_size, rank);
  return flat.narrow(0, e.offset, shape[0] * e.row_numel).view(shape);
}

std::vector<at::Tensor> UnpackAllGather(const at::Tensor& gathered, const FlatParamLayout& layout) {
  const int64_t w = layout.world_size;
  TORCH_CHECK(gathered.numel() == w * layout.shard_numel, "UnpackAllGather: ", gathered.numel(),
              " elements, expected ", w, " x ", layout.shard_numel);
  const at::Tensor by_rank = gathered.view({w, layout.shard_numel});
  std::vector<at::Tensor> out;
  out.reserve(layout.entries.size());
  for (const FlatParamEntry& e : layout.entries) {
    at::Tensor full = at::empty(e.shape, gathered.options());
    at::Tensor full_rows = full.view({e.shape[0], e.row_numel});
    for (int64_t r = 0; r < w; ++r) {
      const ChunkExtent rows = ChunkOf(e.shape[0], w, r);
      if (rows.size == 0) continue;
      full_rows.narrow(0, rows.offset, rows.size)
          .copy_(by_rank[r].narrow(0, e.offset, rows.size * e.row_numel).view({rows.size, e.row_numel}));
    }
    out.push_back(std::move(full));
  }
  return out;
}

at::Tensor PackReduceScatterInput(absl::Span<const at::Tensor> grads, const FlatParamLayout& layout,
                                  at::ScalarType dtype) {
  TORCH_CHECK(grads.size() == layout.entries.size(), "PackReduceScatterInput: ", grads.size(),
              " grads for ", layout.entries.size(), " entries");
  const int64_t w = layout.world_size;
  at::Tensor input = at::zeros({w * layout.shard_numel}, at::TensorOptions().dtype(dtype));
  at::Tensor by_rank = input.view({w, layout.shard_numel});
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    const FlatParamEntry& e = layout.entries[i];
    TORCH_CHECK(grads[i].sizes() == at::IntArrayRef(e.shape), "PackReduceScatterInput: grad ", i,
                " has shape ", grads[i].sizes(), ", expected ", at::IntArrayRef(e.shape));
    const at::Tensor g = grads[i].reshape({e.shape[0], e.row_numel});
    for (int64_t r = 0; r < w; ++r) {
      const ChunkExtent rows = ChunkOf(e.shape[0], w, r);
      if (rows.size == 0) continue;
      by_rank[r].narrow(0, e.offset, rows.size * e.row_numel)
          .view({rows.size, e.row_numel})
          .copy_(g.narrow(0, rows.offset, rows.size));
    }
  }
  return input;
}

}  // namespace tpudist::fsdp
