#include "models/gemma/model_dir.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "models/gemma/bpe_tokenizer.h"
#include "models/gemma/gemma_config.h"
#include "models/gemma/sentencepiece_tokenizer.h"

namespace tpudist::models::gemma {

namespace fs = std::filesystem;

absl::Status CheckModelDir(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (st.type() == fs::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat("model directory ", dir, " does not exist"));
  }
  if (ec) return absl::FailedPreconditionError(absl::StrCat("model directory ", dir, ": ", ec.message()));
  if (st.type() != fs::file_type::directory) {
    return absl::FailedPreconditionError(absl::StrCat("model directory ", dir, " is not a directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& dir, const TokenizerOptions& options) {
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

std::string TokenizerPath(const std::string& dir) {
  const fs::path json = fs::path(dir) / "tokenizer.json";
  return (fs::exists(json) ? json : fs::path(dir) / "tokenizer.model").string();
}

absl::Status CheckTokenizerFitsVocab(const Tokenizer& tokenizer, int64_t vocab_size,
                                     absl::string_view tokenizer_source, absl::string_view config_source) {
  const int64_t max_id = tokenizer.vocab_size() - 1;
  if (max_id >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        tokenizer_source, ": the tokenizer's ids go up to ", max_id, " (", tokenizer.vocab_size(),
        " tokens including added tokens), but ", config_source, " has vocab_size ", vocab_size,
        ": ids >= ", vocab_size, " have no embedding row (tokenizer and model do not match)"));
  }
  const struct {
    const char* name;
    int64_t id;
  } specials[] = {{"pad", tokenizer.pad_id()}, {"bos", tokenizer.bos_id()}, {"eos", tokenizer.eos_id()}};
  for (const auto& s : specials) {
    if (s.id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(tokenizer_source, ": the tokenizer's ", s.name, " id ", s.id,
                                                     " is not below ", config_source, "'s vocab_size ",
                                                     vocab_size));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerForModel(const std::string& dir,
                                                                 const TokenizerOptions& options) {
  if (absl::Status st = CheckModelDir(dir); !st.ok()) return st;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizer(dir, options);
  if (!tok.ok()) return tok.status();
  const std::string config_path = (fs::path(dir) / "config.json").string();
  absl::StatusOr<GemmaConfig> config = LoadGemmaConfig(config_path);
  if (!config.ok()) return config.status();
  if (absl::Status st = CheckTokenizerFitsVocab(**tok, config->vocab_size, TokenizerPath(dir), config_path);
      !st.ok()) {
    return st;
  }
  return tok;
}

}  // namespace tpudist::models::gemma
