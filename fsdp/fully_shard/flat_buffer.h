// Tensor copies between per-parameter tensors and the flat buffers of a
// FlatParamLayout (see flat_param_math.h for the layout). No communication;
// thread-safe (pure functions of their arguments).
#ifndef TPU_DIST_FSDP_FULLY_SHARD_FLAT_BUFFER_H_
#define TPU_DIST_FSDP_FULLY_SHARD_FLAT_BUFFER_H_

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "absl/types/span.h"
#include "fsdp/fully_shard/flat_param_math.h"

namespace tpudist::fsdp {

// A zeroed per-rank flat shard holding rank's rows of every `full` tensor,
// in `dtype`. full[i]: [layout.entries[i].shape]. Returns [shard_numel].
at::Tensor MakeFlatShard(absl::Span<const at::Tensor> full, const FlatParamLayout& layout,
                         int64_t rank, at::ScalarType dtype);

// The view of parameter `i`'s unpadded rows inside a flat shard; writes
// through it land in `flat`. flat: [shard_numel]. Returns [ShardShape(i)].
at::Tensor ShardView(const at::Tensor& flat, const FlatParamLayout& layout, size_t i, int64_t rank);

// Like ShardView, but a plain tensor sharing `flat`'s storage rather than
// an autograd view of it: what a parameter's .grad may be (optimizers'
// zero_grad calls detach_(), which views refuse). flat: [shard_numel].
// Returns [ShardShape(i)].
at::Tensor AliasShard(const at::Tensor& flat, const FlatParamLayout& layout, size_t i, int64_t rank);

// Splits an all-gather output into freshly allocated full tensors (padding
// dropped). gathered: [W * shard_numel]. Returns full[i]: [entries[i].shape].
std::vector<at::Tensor> UnpackAllGather(const at::Tensor& gathered, const FlatParamLayout& layout);

// Packs full gradients into a reduce-scatter input in `dtype`: rank r's
// region holds the rows r owns of each gradient, zero padded. An undefined
// grads[i] counts as zeros. grads[i]: [entries[i].shape]. Returns
// [W * shard_numel].
at::Tensor PackReduceScatterInput(absl::Span<const at::Tensor> grads, const FlatParamLayout& layout,
                                  at::ScalarType dtype);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_FULLY_SHARD_FLAT_BUFFER_H_
