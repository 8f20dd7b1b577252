#include "models/gemma/generation.h"

#include <algorithm>

#include <c10/util/Exception.h>

namespace tpudist::models::gemma {

std::vector<int64_t> GreedyGenerate(GemmaForCausalLMImpl& model, absl::Span<const int64_t> prompt,
                                    int64_t max_new_tokens, absl::Span<const int64_t> stop_ids) {
  TORCH_CHECK(!prompt.empty(), "GreedyGenerate: empty prompt");
  at::NoGradGuard no_grad;
  std::vector<int64_t> seq(prompt.begin(), prompt.end());
  std::vector<int64_t> out;
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    at::Tensor ids = at::tensor(seq, at::kLong).view({1, -1});
    at::Tensor logits = model.forward(ids).logits;  // [1, S, V]
    const int64_t next = logits[0][-1].argmax().item<int64_t>();
    out.push_back(next);
    seq.push_back(next);
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) break;
  }
  return out;
}

}  // namespace tpudist::models::gemma
