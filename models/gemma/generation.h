// Greedy decoding for GemmaForCausalLM (no KV cache: each step reruns the
// whole sequence, which is fine for the tiny model and examples).
#ifndef TPU_DIST_MODELS_GEMMA_GENERATION_H_
#define TPU_DIST_MODELS_GEMMA_GENERATION_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "models/gemma/gemma_model.h"

namespace tpudist::models::gemma {

// Appends up to `max_new_tokens` argmax tokens to `prompt`, stopping after
// any id in `stop_ids`. Returns only the new tokens (a stop id included).
// REQUIRES: prompt non-empty.
std::vector<int64_t> GreedyGenerate(GemmaForCausalLMImpl& model, absl::Span<const int64_t> prompt,
                                    int64_t max_new_tokens, absl::Span<const int64_t> stop_ids);

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_GENERATION_H_
