// BpeTokenizer: the HF `tokenizers` BPE model as Gemma's tokenizer.json uses it.
//
// Pipeline, per tokenizer.json:
//   1. added/special tokens ("added_tokens") are matched on the raw text first
//      (leftmost, then longest) and emitted as their ids;
//   2. each text run between them goes through the normalizer
//      (Replace / Prepend / Sequence; Gemma: Replace " " -> "▁"),
//   3. the pre-tokenizer (null, Split with a string pattern, Metaspace,
//      Sequence; Gemma's Split(" ", merged_with_previous) runs after the
//      normalizer removed every space, so the run stays whole),
//   4. BPE: characters -> vocab ids (byte_fallback to <0xNN> tokens, else
//      unk, fuse_unk merging consecutive unks), then the merge with the lowest
//      rank is applied repeatedly (leftmost first on ties).
// Decoding applies the decoder steps (Replace, ByteFallback, Fuse, Strip,
// Metaspace, Sequence) to the token strings. BOS is prepended when add_bos:
// from the caller, else tokenizer_config.json add_bos_token, else whether the
// post_processor template starts with a special token.
//
// Unsupported components (regex patterns, NFKC, WordPiece/Unigram models...)
// are a load error naming the file and the field.
//
// Thread-safety: immutable after construction.
#ifndef TPU_DIST_MODELS_GEMMA_BPE_TOKENIZER_H_
#define TPU_DIST_MODELS_GEMMA_BPE_TOKENIZER_H_

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "models/gemma/tokenizer.h"

namespace tpudist::models::gemma {

class BpeTokenizer : public Tokenizer {
 public:
  // `config` is tokenizer_config.json's document or null. `source` names the
  // file in errors.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromJson(const nlohmann::json& tokenizer,
                                                                 const nlohmann::json& config,
                                                                 absl::string_view source,
                                                                 std::optional<bool> add_bos = std::nullopt);
  // Reads `tokenizer_json` and, if non-empty and present, `tokenizer_config_json`.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromFiles(const std::string& tokenizer_json,
                                                                  const std::string& tokenizer_config_json,
                                                                  std::optional<bool> add_bos = std::nullopt);

  std::vector<int64_t> Encode(absl::string_view text, std::optional<bool> add_bos = std::nullopt) const override;
  std::string Decode(absl::Span<const int64_t> ids, bool skip_special = true) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  int64_t pad_id() const override { return pad_id_; }
  int64_t bos_id() const override { return bos_id_; }
  int64_t eos_id() const override { return eos_id_; }
  bool add_bos() const override { return add_bos_; }
  std::optional<int64_t> TokenToId(absl::string_view token) const override;
  // The token string of `id` ("" when out of range).
  const std::string& IdToToken(int64_t id) const;

 private:
  struct Step {
    std::string kind;  // component type, e.g. "Replace"
    std::string a, b;  // pattern/content, replacement/prepend_scheme, behavior
    int64_t start = 0, stop = 0;
    bool flag = false;  // Metaspace split
  };
  struct Added {
    std::string content;
    int64_t id;
    bool special;
  };
  struct Merge {
    int32_t rank;
    int64_t id;
  };

  BpeTokenizer() = default;
  std::string Normalize(absl::string_view text) const;
  std::vector<std::string> PreTokenize(const std::string& text, bool first_run) const;
  void EncodePiece(absl::string_view piece, std::vector<int64_t>* out) const;

  std::unordered_map<std::string, int64_t> vocab_;  // includes added tokens
  std::vector<std::string> id_to_token_;
  std::vector<bool> is_special_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id)
  std::vector<Added> added_;                    // sorted by content length, longest first
  std::vector<std::vector<int>> added_by_byte_;  // [256] indices into added_ by first byte
  std::vector<Step> normalizer_, pre_tokenizer_, decoder_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  int64_t unk_id_ = -1;
  int64_t byte_ids_[256];
  int64_t pad_id_ = 0, bos_id_ = 2, eos_id_ = 1;
  bool add_bos_ = false;
};

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_BPE_TOKENIZER_H_
