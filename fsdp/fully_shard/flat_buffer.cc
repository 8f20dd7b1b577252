#include "fsdp/fully_shard/flat_buffer.h"

#include <c10/util/Exception.h>
#include <c10/util/strides.h>

#include <cstring>

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

at::Tensor AliasShard(const at::Tensor& flat, const FlatParamLayout& layout, size_t i, int64_t rank) {
  TORCH_CHECK(flat.is_contiguous() && flat.dim() == 1, "AliasShard: flat buffer must be 1-D contiguous");
  const FlatParamEntry& e = layout.entries[i];
  const std::vector<int64_t> shape = ShardShape(e, layout.world_size, rank);
  const c10::DimVector strides = c10::contiguous_strides(shape);
  return at::empty({0}, flat.options())
      .set_(flat.storage(), flat.storage_offset() + e.offset, shape, strides);
}

namespace {

// Rank r's chunk of a parameter starts at row r * padded_rows (torch.chunk),
// so the padded full parameter is the [W, padded_rows, row_numel] slice of
// the per-rank flat buffers. Copies between that slice (`by_rank`: [W,
// shard_numel]) and `full` ([d0, row_numel]) with at most two strided copies
// per parameter: the ranks whose chunk is whole, then the one partial chunk.
void CopyRanksToFull(const at::Tensor& by_rank, const FlatParamEntry& e, int64_t w,
                     const at::Tensor& full_rows) {
  const int64_t d0 = e.shape[0];
  if (d0 == 0 || e.row_numel == 0) return;
  const at::Tensor src = by_rank.narrow(1, e.offset, e.padded_numel).view({w, e.padded_rows, e.row_numel});
  const int64_t whole = d0 / e.padded_rows, rem = d0 % e.padded_rows;
  if (whole > 0) {
    full_rows.narrow(0, 0, whole * e.padded_rows)
        .view({whole, e.padded_rows, e.row_numel})
        .copy_(src.narrow(0, 0, whole));
  }
  if (rem > 0) full_rows.narrow(0, whole * e.padded_rows, rem).copy_(src[whole].narrow(0, 0, rem));
}

void CopyFullToRanks(const at::Tensor& full_rows, const FlatParamEntry& e, int64_t w,
                     const at::Tensor& by_rank) {
  const int64_t d0 = e.shape[0];
  if (d0 == 0 || e.row_numel == 0) return;
  const at::Tensor dst = by_rank.narrow(1, e.offset, e.padded_numel).view({w, e.padded_rows, e.row_numel});
  const int64_t whole = d0 / e.padded_rows, rem = d0 % e.padded_rows;
  if (whole > 0) {
    dst.narrow(0, 0, whole).copy_(
        full_rows.narrow(0, 0, whole * e.padded_rows).view({whole, e.padded_rows, e.row_numel}));
  }
  if (rem > 0) dst[whole].narrow(0, 0, rem).copy_(full_rows.narrow(0, whole * e.padded_rows, rem));
}

// The same copies as one memcpy per (parameter, rank) block, for contiguous
// buffers of one dtype: a parameter group unshards twice a step, and at
// the tiny model's sizes the two TensorIterator copies per parameter cost
// more than the bytes they move. by_rank: W rows of shard_bytes; full: the
// parameter's [d0, row_numel] rows.
void MemcpyRanksToFull(const uint8_t* by_rank, int64_t shard_bytes, const FlatParamEntry& e,
                       int64_t w, int64_t elem_bytes, uint8_t* full) {
  const int64_t row_bytes = e.row_numel * elem_bytes;
  for (int64_t r = 0; r < w; ++r) {
    const ChunkExtent rows = ShardRows(e, w, r);
    if (rows.size == 0 || row_bytes == 0) continue;
    std::memcpy(full + rows.offset * row_bytes, by_rank + r * shard_bytes + e.offset * elem_bytes,
                rows.size * row_bytes);
  }
}

void MemcpyFullToRanks(const uint8_t* full, const FlatParamEntry& e, int64_t w,
                       int64_t elem_bytes, int64_t shard_bytes, uint8_t* by_rank) {
  const int64_t row_bytes = e.row_numel * elem_bytes;
  for (int64_t r = 0; r < w; ++r) {
    const ChunkExtent rows = ShardRows(e, w, r);
    if (rows.size == 0 || row_bytes == 0) continue;
    std::memcpy(by_rank + r * shard_bytes + e.offset * elem_bytes, full + rows.offset * row_bytes,
                rows.size * row_bytes);
  }
}

}  // namespace

std::vector<at::Tensor> UnpackAllGather(const at::Tensor& gathered, const FlatParamLayout& layout) {
  const int64_t w = layout.world_size;
  TORCH_CHECK(gathered.numel() == w * layout.shard_numel, "UnpackAllGather: ", gathered.numel(),
              " elements, expected ", w, " x ", layout.shard_numel);
  const at::Tensor by_rank = gathered.view({w, layout.shard_numel});
  const bool flat = gathered.is_contiguous();
  const int64_t elem = gathered.element_size();
  std::vector<at::Tensor> out;
  out.reserve(layout.entries.size());
  for (const FlatParamEntry& e : layout.entries) {
    at::Tensor full = at::empty(e.shape, gathered.options());
    if (flat) {
      MemcpyRanksToFull(static_cast<const uint8_t*>(gathered.data_ptr()),
                        layout.shard_numel * elem, e, w, elem,
                        static_cast<uint8_t*>(full.data_ptr()));
    } else {
      CopyRanksToFull(by_rank, e, w, full.view({e.shape[0], e.row_numel}));
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
  const at::Tensor by_rank = input.view({w, layout.shard_numel});
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    const FlatParamEntry& e = layout.entries[i];
    TORCH_CHECK(grads[i].sizes() == at::IntArrayRef(e.shape), "PackReduceScatterInput: grad ", i,
                " has shape ", grads[i].sizes(), ", expected ", at::IntArrayRef(e.shape));
    if (grads[i].scalar_type() == dtype && grads[i].is_contiguous()) {
      const int64_t elem = input.element_size();
      MemcpyFullToRanks(static_cast<const uint8_t*>(grads[i].data_ptr()), e, w, elem,
                        layout.shard_numel * elem, static_cast<uint8_t*>(input.data_ptr()));
    } else {  // casts while it copies (bf16 grads into an fp32 reduction)
      CopyFullToRanks(grads[i].reshape({e.shape[0], e.row_numel}), e, w, by_rank);
    }
  }
  return input;
}

}  // namespace tpudist::fsdp
