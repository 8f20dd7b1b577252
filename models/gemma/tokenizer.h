// Tokenizer: the interface the trainer, examples and tests use, and
// LoadTokenizer, which picks the implementation a model directory calls for:
// tokenizer.json (HF tokenizers BPE, see bpe_tokenizer.h) when present, else
// tokenizer.model (SentencePiece, see sentencepiece_tokenizer.h).
//
// Thread-safety: implementations are immutable after construction; Encode
// and Decode may be called concurrently.
#ifndef TPU_DIST_MODELS_GEMMA_TOKENIZER_H_
#define TPU_DIST_MODELS_GEMMA_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tpudist::models::gemma {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids for `text`. `add_bos` overrides the tokenizer's default
  // (tokenizer_config.json add_bos_token, or the loader's flag). Never fails:
  // characters outside the vocabulary become byte-fallback tokens or unk.
  virtual std::vector<int64_t> Encode(absl::string_view text, std::optional<bool> add_bos = std::nullopt) const = 0;

  // The first `max_tokens` ids of Encode(text, add_bos), identical to them,
  // for truncating callers (the fine-tune keeps max_seq_len tokens of each
  // example). Implementations may stop tokenizing once those ids are known
  // (BpeTokenizer does, see bpe_tokenizer.h); this default encodes the whole
  // text. REQUIRES: max_tokens >= 0.
  virtual std::vector<int64_t> EncodeHead(absl::string_view text, int64_t max_tokens,
                                          std::optional<bool> add_bos = std::nullopt) const;

  // Text for `ids`; special tokens (pad/bos/eos/...) are dropped when
  // `skip_special`. As HF's decode (skip_special_tokens=False), the default
  // keeps them. Out-of-range ids are skipped.
  virtual std::string Decode(absl::Span<const int64_t> ids, bool skip_special = false) const = 0;

  // One past the largest id Encode can return: the model vocabulary and the
  // added tokens.
  virtual int64_t vocab_size() const = 0;
  virtual int64_t pad_id() const = 0;
  virtual int64_t bos_id() const = 0;
  virtual int64_t eos_id() const = 0;
  virtual bool add_bos() const = 0;
  // The id of `token` (exact vocabulary/added-token string), or nullopt.
  virtual std::optional<int64_t> TokenToId(absl::string_view token) const = 0;
};

struct TokenizerOptions {
  std::optional<bool> add_bos;  // overrides tokenizer_config.json
  // Where the SentencePiece shim library lives (see sentencepiece_tokenizer.h);
  // empty means the built-in default.
  std::string sentencepiece_shim;
};

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_TOKENIZER_H_
