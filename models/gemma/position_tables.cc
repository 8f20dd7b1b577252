#include "models/gemma/position_tables.h"

#include <c10/util/Exception.h>

#include "models/gemma/attention_mask.h"
#include "models/gemma/rope.h"

namespace tpudist::models::gemma {

AttentionTables BuildAttentionTables(const GemmaConfig& config, int64_t seq_len, at::ScalarType dtype,
                                     at::Device device) {
  TORCH_CHECK(seq_len >= 1, "BuildAttentionTables: seq_len must be >= 1, got ", seq_len);
  at::Tensor positions = at::arange(seq_len, at::kLong).unsqueeze(0);  // [1, S]
  const int64_t full_dim = config.global_head_dim > 0 ? config.global_head_dim : config.head_dim;
  auto [cos_s, sin_s] = RopeCosSin(RopeInvFreq(config.sliding_rope, config.head_dim), positions, dtype);
  auto [cos_f, sin_f] = RopeCosSin(RopeInvFreq(config.full_rope, full_dim), positions, dtype);
  AttentionTables t;
  t.cos_sliding = cos_s.to(device);
  t.sin_sliding = sin_s.to(device);
  t.cos_full = cos_f.to(device);
  t.sin_full = sin_f.to(device);
  t.mask_sliding = AdditiveMask(VisibleMask(seq_len, config.sliding_window, at::Tensor()), dtype).to(device);
  t.mask_full = AdditiveMask(VisibleMask(seq_len, std::nullopt, at::Tensor()), dtype).to(device);
  return t;
}

const AttentionTables& PositionTables::Get(int64_t seq_len, at::ScalarType dtype, at::Device device) {
  const Key key{seq_len, dtype, device};
  if (!key_.has_value() || !(*key_ == key)) {
    // Build before replacing the key: a throwing build leaves no half entry.
    tables_ = BuildAttentionTables(config_, seq_len, dtype, device);
    key_ = key;
    ++builds_;
  }
  return tables_;
}

}  // namespace tpudist::models::gemma
