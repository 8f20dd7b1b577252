#include "models/gemma/bpe_merge.h"

#include <algorithm>
#include <functional>
#include <queue>

#include "absl/strings/string_view.h"

namespace tpudist::models::gemma {

void ApplyBpeMerges(absl::Span<const int64_t> symbols, const BpeMergeMap& merges, std::vector<int64_t>* out) {
  if (symbols.empty()) return;
  struct Sym {
    int64_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Sym> syms;
  syms.reserve(symbols.size());
  for (size_t i = 0; i < symbols.size(); ++i) {
    syms.push_back(Sym{symbols[i], static_cast<int>(i) - 1, static_cast<int>(i) + 1, true});
  }
  syms.back().next = -1;
  struct Cand {
    int32_t rank;
    int pos;
    int64_t merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int pos) {
    if (pos < 0 || syms[pos].next < 0) return;
    auto m = merges.find(BpeMergeKey(syms[pos].id, syms[syms[pos].next].id));
    if (m != merges.end()) heap.push(Cand{m->second.rank, pos, m->second.id});
  };
  for (int i = 0; i < static_cast<int>(syms.size()); ++i) consider(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    Sym& s = syms[c.pos];
    if (!s.alive || s.next < 0) continue;
    // Stale unless the pair there now merges into the same token (HF's test:
    // it compares the resulting id, not the pair, and keeps the queued rank).
    auto m = merges.find(BpeMergeKey(s.id, syms[s.next].id));
    if (m == merges.end() || m->second.id != c.merged) continue;
    Sym& r = syms[s.next];
    r.alive = false;
    s.id = c.merged;
    s.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.pos;
    consider(s.prev);
    consider(c.pos);
  }
  for (const Sym& s : syms) {
    if (s.alive) out->push_back(s.id);
  }
}

BpeCutChecker::BpeCutChecker(const BpeMergeMap& merges, absl::Span<const std::string> id_to_token) {
  const auto str = [&](int64_t id) -> const std::string* {
    return id >= 0 && static_cast<size_t>(id) < id_to_token.size() ? &id_to_token[id] : nullptr;
  };
  for (const auto& [key, merge] : merges) {
    const std::string* left = str(static_cast<int64_t>(key >> 32));
    const std::string* right = str(static_cast<int64_t>(key & 0xffffffffu));
    const std::string* result = str(merge.id);
    if (left == nullptr || right == nullptr || result == nullptr || left->empty() || right->empty() ||
        *result != *left + *right) {
      results_.clear();
      return;  // disabled: the string argument does not hold
    }
    results_.insert(*result);
    max_bytes_ = std::max(max_bytes_, result->size());
  }
  enabled_ = !results_.empty();
}

bool BpeCutChecker::IsCut(absl::Span<const int64_t> symbols, size_t p,
                          absl::Span<const std::string> id_to_token) const {
  // The strings of symbols[first, last) laid end to end; offsets[k] is where
  // symbols[first + k] starts. Windows are substrings of it.
  size_t first = p, last = p, left_bytes = 0, right_bytes = 0;
  while (first > 0 && left_bytes < max_bytes_) left_bytes += id_to_token[symbols[--first]].size();
  while (last < symbols.size() && right_bytes < max_bytes_) right_bytes += id_to_token[symbols[last++]].size();
  std::string text;
  std::vector<size_t> offsets;
  for (size_t k = first; k < last; ++k) {
    if (id_to_token[symbols[k]].empty()) return false;  // cannot bound the windows
    offsets.push_back(text.size());
    text += id_to_token[symbols[k]];
  }
  offsets.push_back(text.size());
  const absl::string_view all(text);
  for (size_t i = first; i < p; ++i) {
    const size_t begin = offsets[i - first];
    for (size_t j = p; j < last; ++j) {  // window symbols[i..j]
      const size_t end = offsets[j + 1 - first];
      if (end - begin > max_bytes_) break;
      if (results_.contains(all.substr(begin, end - begin))) return false;
    }
  }
  return true;
}

}  // namespace tpudist::models::gemma
