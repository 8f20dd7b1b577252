#include "models/gemma/attention_mask.h"

#include <c10/util/Exception.h>

namespace tpudist::models::gemma {

at::Tensor VisibleMask(int64_t seq_len, std::optional<int64_t> window, const at::Tensor& padding_mask) {
  at::Tensor q = at::arange(seq_len, at::kLong).unsqueeze(1);  // [S, 1]
  at::Tensor k = at::arange(seq_len, at::kLong).unsqueeze(0);  // [1, S]
  at::Tensor visible = k <= q;
  if (window.has_value()) visible = visible & (k > q - *window);
  visible = visible.unsqueeze(0).unsqueeze(0);  // [1, 1, S, S]
  if (padding_mask.defined()) {
    TORCH_CHECK(padding_mask.dim() == 2 && padding_mask.size(1) == seq_len,
                "VisibleMask: padding_mask must be [B, ", seq_len, "], got ", padding_mask.sizes());
    visible = visible & padding_mask.to(at::kBool).unsqueeze(1).unsqueeze(1);  // [B, 1, S, S]
  }
  return visible;
}

at::Tensor AdditiveMask(const at::Tensor& visible, at::ScalarType dtype) {
  at::Tensor zeros = at::zeros(visible.sizes(), at::TensorOptions().dtype(dtype));
  double lowest = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "AdditiveMask", [&] {
    lowest = static_cast<double>(std::numeric_limits<scalar_t>::lowest());
  });
  return zeros.masked_fill(visible.logical_not(), lowest);
}

}  // namespace tpudist::models::gemma
