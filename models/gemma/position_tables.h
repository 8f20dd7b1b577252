// PositionTables: the per-forward inputs of the attention layers that depend
// only on the sequence length, the activation dtype and the device -- the two
// RoPE cos/sin tables (sliding and full layers) and the two causal additive
// masks without padding -- built once and reused while those stay the same.
//
// The model forward used to rebuild them every call (inv_freq, an outer
// product, cos, sin, casts; two S x S masks); in a training step of a small
// model those ~30 ops are pure overhead. The tables only ever broadcast over
// the batch, so they are stored with a leading 1:
//   cos/sin [1, S, D], mask [1, 1, S, S].
//
// Invalidation: the entry is keyed on (seq_len, dtype, device); a call with
// any other key rebuilds it (one entry: the last key, so a generation loop
// whose length grows by one per step does no worse than before). The config
// is fixed at construction. A padding mask is per batch and is never cached:
// the model builds padded masks per call.
//
// The returned tensors are shared by every caller of the same key: callers
// must treat them as read-only (no in-place ops). They never require grad.
//
// Thread-safety: not thread-safe (like the module that owns it).
#ifndef TPU_DIST_MODELS_GEMMA_POSITION_TABLES_H_
#define TPU_DIST_MODELS_GEMMA_POSITION_TABLES_H_

#include <cstdint>
#include <optional>

#include <ATen/ATen.h>

#include "models/gemma/gemma_config.h"

namespace tpudist::models::gemma {

struct AttentionTables {
  at::Tensor cos_sliding;   // [1, S, head_dim]
  at::Tensor sin_sliding;   // [1, S, head_dim]
  at::Tensor cos_full;      // [1, S, full_head_dim]
  at::Tensor sin_full;      // [1, S, full_head_dim]
  at::Tensor mask_sliding;  // additive [1, 1, S, S]: causal and within the window
  at::Tensor mask_full;     // additive [1, 1, S, S]: causal
};

// Builds the tables from scratch (what the cache stores). Pure.
// REQUIRES: seq_len >= 1.
AttentionTables BuildAttentionTables(const GemmaConfig& config, int64_t seq_len, at::ScalarType dtype,
                                     at::Device device);

class PositionTables {
 public:
  explicit PositionTables(const GemmaConfig& config) : config_(config) {}

  // The tables for (seq_len, dtype, device); builds them on a miss.
  const AttentionTables& Get(int64_t seq_len, at::ScalarType dtype, at::Device device);

  // How many times Get built the tables (tests: hits do not build).
  int64_t builds() const { return builds_; }

 private:
  struct Key {
    int64_t seq_len;
    at::ScalarType dtype;
    at::Device device;
    bool operator==(const Key& o) const { return seq_len == o.seq_len && dtype == o.dtype && device == o.device; }
  };

  GemmaConfig config_;
  std::optional<Key> key_;  // key of tables_; nullopt before the first Get
  AttentionTables tables_;
  int64_t builds_ = 0;
};

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_POSITION_TABLES_H_
