// BpeTokenizer: the HF `tokenizers` BPE model as Gemma's tokenizer.json uses it.
//
// Pipeline, per tokenizer.json (HF tokenizers' order, checked against
// tokenizers 0.23 by tokenizer_oracle_test on tests/oracles fixtures):
//   0. ill-formed UTF-8 input is first made well-formed the way Python's
//      bytes.decode("utf-8", errors="replace") does (one U+FFFD per maximal
//      subpart), since HF tokenizers only ever see such strings;
//   1. added tokens with `normalized: false` are matched on the raw text,
//      leftmost then longest, non-overlapping; `single_word` drops a match
//      next to a word character (regex \w), `lstrip` / `rstrip` absorb the
//      Unicode whitespace (regex \s) before / after it;
//   2. each remaining piece goes through the normalizer (Replace / Prepend /
//      Sequence; Gemma: Replace " " -> "▁"), and added tokens with
//      `normalized: true` are matched the same way on the normalized piece,
//      against their normalized content (so lstrip/rstrip there never see a
//      space, only "▁");
//   3. the pre-tokenizer (null, Split with a string pattern, Metaspace,
//      Sequence; Gemma's Split(" ", merged_with_previous) runs after the
//      normalizer removed every space, so the run stays whole);
//   4. BPE: characters -> vocab ids (byte_fallback to <0xNN> tokens, else
//      unk, fuse_unk merging consecutive unks), then the merge with the lowest
//      rank is applied repeatedly (leftmost first on ties). A merge listed
//      twice has the rank of its last occurrence, as in HF's merge map.
// EncodeHead(text, n) returns Encode(text)'s first n ids but merges only the
// head of a long word (bpe_merge.h): it takes ~2n symbols, looks for a cut
// there that no merge can cross, merges up to it, and doubles the head while
// that yields fewer than n tokens. It falls back to merging the whole word
// when no provable cut turns up within kMaxCutSearch symbols (e.g. long runs
// of one repeated merge), and always runs the linear steps 0-3 on the whole
// text. So a 10 MB example costs about a linear scan, not a full BPE.
// Decoding maps ids to token strings (added tokens first), drops special
// tokens when asked (HF's default is to keep them, and so is ours), and
// applies the decoder steps (Replace, ByteFallback, Fuse, Strip, Metaspace,
// Sequence) to all of them. BOS is prepended when add_bos: from the caller,
// else tokenizer_config.json add_bos_token, else whether the post_processor
// template starts with a special token.
//
// Unsupported components (regex patterns, NFKC, WordPiece/Unigram models...)
// are a load error naming the file and the field. Known differences from HF:
// \w is approximated outside the common scripts (see IsWordChar in utf8.h),
// and an added token that starts with whitespace right after an rstrip
// token is not matched inside the whitespace that token absorbed.
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
#include "models/gemma/bpe_merge.h"
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
  std::vector<int64_t> EncodeHead(absl::string_view text, int64_t max_tokens,
                                  std::optional<bool> add_bos = std::nullopt) const override;
  std::string Decode(absl::Span<const int64_t> ids, bool skip_special = false) const override;
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
    std::string pattern;  // matched text: content, or its normalized form when `normalized`
    int64_t id = 0;
    bool special = false;
    bool normalized = false;
    bool lstrip = false;
    bool rstrip = false;
    bool single_word = false;
  };
  // A piece of the input: an added token's id, or text still to encode.
  struct Segment {
    int64_t id = -1;  // >= 0 for an added token
    size_t begin = 0, end = 0;  // byte range in the split string
  };
  // [256] lists of indices into added_ by the pattern's first byte, longest
  // pattern first.
  using AddedIndex = std::vector<std::vector<int>>;

  // Symbols past the head EncodeHead tries as cuts before merging the whole word.
  static constexpr size_t kMaxCutSearch = 512;

  BpeTokenizer() = default;
  std::string Normalize(absl::string_view text) const;
  std::vector<std::string> PreTokenize(const std::string& text, bool at_start) const;
  // Encode, stopping once `limit` ids are out (-1: no limit); may return
  // more than `limit`, all of them Encode's.
  std::vector<int64_t> EncodeUpTo(absl::string_view input, std::optional<bool> add_bos, int64_t limit) const;
  // Appends the leaf symbols of piece's characters from byte *pos on until
  // `symbols` holds `count` or the piece ends; advances *pos.
  void AppendSymbols(absl::string_view piece, size_t count, size_t* pos, std::vector<int64_t>* symbols) const;
  // Appends the BPE tokens of `piece`: all of them, or (limit >= 0) at least
  // `limit` leading ones when the piece has that many.
  void EncodePiece(absl::string_view piece, std::vector<int64_t>* out, int64_t limit = -1) const;
  // HF AddedVocabulary::find_matches: splits `text` at the added tokens of
  // `index` (leftmost-longest, then the single_word / lstrip / rstrip rules).
  std::vector<Segment> SplitAdded(absl::string_view text, const AddedIndex& index) const;

  std::unordered_map<std::string, int64_t> vocab_;        // model vocabulary and added tokens
  std::unordered_map<std::string, int64_t> model_vocab_;  // model.vocab only (what BPE looks up)
  std::vector<std::string> id_to_token_;
  std::vector<bool> is_special_;
  BpeMergeMap merges_;
  std::unique_ptr<BpeCutChecker> cuts_;  // for EncodeHead
  std::vector<Added> added_;
  AddedIndex raw_added_;         // normalized == false: matched on the raw text
  AddedIndex normalized_added_;  // normalized == true: matched on normalized pieces
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
