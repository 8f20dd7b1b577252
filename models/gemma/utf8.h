// Tiny UTF-8 helpers shared by the BPE tokenizer and trainer. Pure.
#ifndef TPU_DIST_MODELS_GEMMA_UTF8_H_
#define TPU_DIST_MODELS_GEMMA_UTF8_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tpudist::models::gemma {

// "▁" (U+2581), SentencePiece's visible space.
inline constexpr absl::string_view kMetaspace = "\xe2\x96\x81";

// Length of the UTF-8 sequence starting with byte `lead` (1 for invalid
// bytes, so malformed input is still split into single bytes).
inline int Utf8CharLen(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xe) return 3;
  if ((lead >> 3) == 0x1e) return 4;
  return 1;
}

// Splits `s` into code points (as byte strings); truncated sequences at the
// end become single bytes.
inline std::vector<absl::string_view> SplitUtf8(absl::string_view s) {
  std::vector<absl::string_view> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = Utf8CharLen(static_cast<unsigned char>(s[i]));
    if (i + n > s.size()) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

inline std::string ReplaceAll(absl::string_view s, absl::string_view from, absl::string_view to) {
  if (from.empty()) return std::string(s);
  std::string out;
  size_t i = 0;
  while (true) {
    size_t j = s.find(from, i);
    if (j == absl::string_view::npos) break;
    out.append(s.data() + i, j - i);
    out.append(to.data(), to.size());
    i = j + from.size();
  }
  out.append(s.data() + i, s.size() - i);
  return out;
}

}  // namespace tpudist::models::gemma

#endif  // TPU_DIST_MODELS_GEMMA_UTF8_H_
