#include "models/gemma/tokenizer.h"

#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/gemma/bpe_tokenizer.h"
#include "models/gemma/model_dir.h"
#include "models/gemma/sentencepiece_tokenizer.h"

namespace tpudist::models::gemma {

std::vector<int64_t> Tokenizer::EncodeHead(absl::string_view text, int64_t max_tokens,
                                           std::optional<bool> add_bos) const {
  std::vector<int64_t> ids = Encode(text, add_bos);
  if (static_cast<int64_t>(ids.size()) > max_tokens) ids.resize(static_cast<size_t>(max_tokens));
  return ids;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& dir, const TokenizerOptions& options) {
  namespace fs = std::filesystem;
  if (absl::Status st = CheckModelDir(dir); !st.ok()) return st;
  const fs::path root(dir);
  if (fs::exists(root / "tokenizer.json")) {
    auto t = BpeTokenizer::FromFiles((root / "tokenizer.json").string(), (root / "tokenizer_config.json").string(),
                                     options.add_bos);
    if (!t.ok()) return t.status();
    return std::unique_ptr<Tokenizer>(std::move(*t));
  }
  if (fs::exists(root / "tokenizer.model")) {
    auto t = SentencePieceTokenizer::Load((root / "tokenizer.model").string(), options.add_bos,
                                          options.sentencepiece_shim);
    if (!t.ok()) return t.status();
    return std::unique_ptr<Tokenizer>(std::move(*t));
  }
  return absl::NotFoundError(absl::StrCat(dir, ": no tokenizer.json or tokenizer.model"));
}

}  // namespace tpudist::models::gemma
