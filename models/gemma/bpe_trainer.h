// A small byte-fallback BPE trainer producing a Gemma-style tokenizer.json.
//
// Training: the corpus is normalised like Gemma (" " -> "▁") and cut into
// words, each starting at a "▁" (newlines are words of their own), so merges
// never cross a word start. Classic BPE over word counts: repeatedly merge the
// most frequent adjacent pair (ties: the lexicographically smallest pair),
// until the vocabulary reaches options.vocab_size.
//
// Vocabulary layout: special tokens first (Gemma: <pad>=0 <eos>=1 <bos>=2
// <unk>=3), the 256 byte tokens <0x00>..<0xFF>, the corpus' characters (by
// descending count, then by string), then merged tokens in merge order.
//
// The tokenizer.json written by BpeTokenizerJson has Gemma's components:
// normalizer Replace(" " -> "▁"), pre_tokenizer Split(" ",
// MergedWithPrevious), decoder [Replace("▁" -> " "), ByteFallback, Fuse], BPE
// with byte_fallback, special tokens as added_tokens.
//
// Pure functions.
#ifndef TPU_DIST_MODELS_GEMMA_BPE_TRAINER_H_
#define TPU_DIST_MODELS_GEMMA_BPE_TRAINER_H_

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpudist::models::gemma {

struct BpeTrainerOptions {
  int64_t vocab_size = 512;
  std::vector<std::string> special_tokens = {"<pad>", "<eos>", "<bos>", "<unk>"};
};

struct BpeModel {
  std::vector<std::string> vocab;                            // id -> token
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  int64_t num_special = 0;                                   // vocab[0, num_special) are special
};

// InvalidArgument when vocab_size cannot even hold specials + bytes + chars.
// Fewer merges than requested are learned when the corpus runs out of pairs
// (the vocabulary is then smaller than vocab_size).
absl::StatusOr<BpeModel> TrainBpe(absl::string_view corpus, const BpeTrainerOptions& options);

// tokenizer.json for `model`; unk is "<unk>" when present.
nlohmann::json BpeTokenizerJson(const BpeModel& model);

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_BPE_TRAINER_H_
