#include "models/gemma/tokenizer.h"

#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tpudist::models::gemma {

std::vector<int64_t> Tokenizer::EncodeHead(absl::string_view text, int64_t max_tokens,
                                           std::optional<bool> add_bos) const {
  std::vector<int64_t> ids = Encode(text, add_bos);
  if (static_cast<int64_t>(ids.size()) > max_tokens) ids.resize(static_cast<size_t>(max_tokens));
  return ids;
}

}  // namespace tpudist::models::gemma
