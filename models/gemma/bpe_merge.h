// The merge step of the HF `tokenizers` BPE model on one pre-tokenized word,
// and the test that lets a caller merge only the head of a long word.
//
// ApplyBpeMerges: the word starts as a list of symbols (vocabulary ids of its
// characters, or byte-fallback / unk ids); the applicable merge of lowest
// rank is applied repeatedly, leftmost first on ties, until none applies (HF
// Word::merge_all, with its staleness test by the merged id).
//
// Head-only merging. Gemma's tokenizer.json turns spaces into "▁" before
// pre-tokenization, so a whole example is one word, and merging it costs time
// in its full length even when only max_seq_len tokens are kept. Merging
// only symbols[0, p) gives exactly the full word's tokens left of p whenever
// p is a boundary of the full result (no merge ever joins a symbol left of p
// with one right of it): the merges left of p see the same pairs in the same
// (rank, position) order in both runs, and the pair across p is never applied
// in the full run. BpeCutChecker::IsCut proves p is such a boundary without
// running the full merge: every symbol a merge creates has as its string the
// concatenation of its leaves' strings (checked for every merge on
// construction), so a symbol across p would be a merge result whose string
// is some symbols[i..j]'s strings concatenated, with i < p <= j. If no such
// window (at most max_bytes() long) is a merge result, nothing crosses p.
//
// Thread-safety: immutable after construction.
#ifndef TPU_DIST_MODELS_GEMMA_BPE_MERGE_H_
#define TPU_DIST_MODELS_GEMMA_BPE_MERGE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"

namespace tpudist::models::gemma {

struct BpeMerge {
  int32_t rank;  // lower merges first; unique per merge
  int64_t id;    // the merged token
};
// (left id << 32 | right id) -> merge.
using BpeMergeMap = std::unordered_map<uint64_t, BpeMerge>;

inline uint64_t BpeMergeKey(int64_t left, int64_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint64_t>(right);
}

// Merges `symbols` (one word's leaf ids) and appends the resulting ids to
// `out`.
void ApplyBpeMerges(absl::Span<const int64_t> symbols, const BpeMergeMap& merges, std::vector<int64_t>* out);

class BpeCutChecker {
 public:
  // `id_to_token`: every id's string (the vocabulary and added tokens).
  // enabled() is false when some merge's result string is not the
  // concatenation of its two parts' strings (a vocabulary with one string
  // under two ids), or when no merge exists.
  BpeCutChecker(const BpeMergeMap& merges, absl::Span<const std::string> id_to_token);

  bool enabled() const { return enabled_; }
  // The longest merge result, in bytes. IsCut reads that many bytes of
  // symbols on each side of the cut.
  size_t max_bytes() const { return max_bytes_; }

  // True when no merge can join symbols[.., p) with symbols[p, ..): no merge
  // result equals the strings of symbols[i..j] concatenated, i < p <= j.
  // REQUIRES: enabled(); 0 < p < symbols.size(); `symbols` holds at least
  // max_bytes() bytes of strings right of p, or ends where the word ends.
  // `id_to_token` is the table given to the constructor.
  bool IsCut(absl::Span<const int64_t> symbols, size_t p, absl::Span<const std::string> id_to_token) const;

 private:
  absl::flat_hash_set<std::string> results_;  // strings of every merge result
  size_t max_bytes_ = 0;
  bool enabled_ = false;
};

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_BPE_MERGE_H_
