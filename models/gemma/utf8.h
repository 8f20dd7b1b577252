// UTF-8 and Unicode-class helpers shared by the BPE tokenizer and trainer. Pure.
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

// `s` with every ill-formed UTF-8 subsequence replaced by U+FFFD, one per
// maximal subpart (Unicode 3.9, "U+FFFD substitution of maximal subparts"),
// which is what Python's bytes.decode("utf-8", errors="replace") does before
// HF tokenizers ever see the text. Well-formed input is returned unchanged.
inline std::string SanitizeUtf8(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  const size_t n = s.size();
  auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  for (size_t i = 0; i < n;) {
    const unsigned char b = byte(i);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    // Length and the allowed range of the second byte (Table 3-7).
    int len = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) {
      len = 2;
    } else if (b >= 0xe0 && b <= 0xef) {
      len = 3;
      if (b == 0xe0) lo = 0xa0;
      if (b == 0xed) hi = 0x9f;
    } else if (b >= 0xf0 && b <= 0xf4) {
      len = 4;
      if (b == 0xf0) lo = 0x90;
      if (b == 0xf4) hi = 0x8f;
    }
    size_t k = 1;  // bytes of the longest well-formed prefix
    if (len > 0 && i + 1 < n && byte(i + 1) >= lo && byte(i + 1) <= hi) {
      k = 2;
      while (static_cast<int>(k) < len && i + k < n && (byte(i + k) & 0xc0) == 0x80) ++k;
    }
    if (len > 0 && static_cast<int>(k) == len) {
      out.append(s.data() + i, k);
    } else {
      out.append("\xef\xbf\xbd");
    }
    i += k;
  }
  return out;
}

// The code point of the well-formed UTF-8 character at s[i]; sets *len.
inline char32_t DecodeUtf8At(absl::string_view s, size_t i, size_t* len) {
  const unsigned char b = static_cast<unsigned char>(s[i]);
  size_t n = Utf8CharLen(b);
  if (i + n > s.size()) n = 1;
  *len = n;
  if (n == 1) return b;
  char32_t cp = b & (0x7f >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  return cp;
}

// The code point of the last character of well-formed `s`. REQUIRES: non-empty.
inline char32_t LastCodePoint(absl::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xc0) == 0x80) --i;
  size_t len;
  return DecodeUtf8At(s, i, &len);
}

// Unicode White_Space: what `\s` matches in the Rust regex crate (and hence in
// HF tokenizers' added-token lstrip/rstrip).
inline bool IsUnicodeWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

// `\w` of the Rust regex crate (Alphabetic, marks, decimal digits, connector
// punctuation, join controls), which HF tokenizers' single_word added tokens
// test their neighbours with. Exact for ASCII, Latin-1, Latin extensions,
// combining marks, general punctuation, symbols, emoji, CJK punctuation,
// kana, CJK ideographs and Hangul; other scripts are treated as letters
// with their common punctuation excluded (an approximation of the ~760 ranges
// of the real property).
inline bool IsWordChar(char32_t c) {
  struct Range {
    char32_t lo, hi;
  };
  // Sorted, disjoint.
  static constexpr Range kWord[] = {
      {0x30, 0x39}, {0x41, 0x5a}, {0x5f, 0x5f}, {0x61, 0x7a}, {0xaa, 0xaa}, {0xb5, 0xb5}, {0xba, 0xba},
      {0xc0, 0xd6}, {0xd8, 0xf6}, {0xf8, 0x2c1}, {0x2c6, 0x2d1}, {0x2e0, 0x2e4}, {0x2ec, 0x2ec},
      {0x2ee, 0x2ee}, {0x300, 0x374}, {0x376, 0x37d}, {0x37f, 0x37f}, {0x386, 0x386}, {0x388, 0x3f5},
      {0x3f7, 0x481}, {0x483, 0x559}, {0x560, 0x588}, {0x591, 0x5bd}, {0x5bf, 0x5bf}, {0x5c1, 0x5c2},
      {0x5c4, 0x5c5}, {0x5c7, 0x5f2}, {0x610, 0x61a}, {0x620, 0x669}, {0x66e, 0x6d3}, {0x6d5, 0x6dc},
      {0x6df, 0x6e8}, {0x6ea, 0x6fc}, {0x6ff, 0x6ff}, {0x710, 0x963}, {0x966, 0x96f}, {0x971, 0xe3e},
      {0xe40, 0xe4e}, {0xe50, 0xe59}, {0xe5c, 0x10fa}, {0x10fc, 0x135f}, {0x1369, 0x166c},
      {0x166f, 0x167f}, {0x1681, 0x16ea}, {0x16ee, 0x1734}, {0x1737, 0x17d3}, {0x17db, 0x17ff},
      {0x180b, 0x1fbc}, {0x1fbe, 0x1fbe}, {0x1fc2, 0x1fcc}, {0x1fd0, 0x1fdc}, {0x1fe0, 0x1fec},
      {0x1ff2, 0x1ffc}, {0x200c, 0x200d}, {0x203f, 0x2040}, {0x2054, 0x2054}, {0x2071, 0x2071},
      {0x207f, 0x207f}, {0x2090, 0x209c}, {0x20d0, 0x20f0}, {0x2102, 0x2102}, {0x2107, 0x2107},
      {0x210a, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211d}, {0x2124, 0x2124}, {0x2126, 0x2126},
      {0x2128, 0x2128}, {0x212a, 0x212d}, {0x212f, 0x2139}, {0x213c, 0x213f}, {0x2145, 0x2149},
      {0x214e, 0x214e}, {0x2160, 0x2188}, {0x24b6, 0x24e9}, {0x2c00, 0x2ce4}, {0x2ceb, 0x2cf8},
      {0x2cfd, 0x2cfd}, {0x2d00, 0x2d6f}, {0x2d7f, 0x2dff}, {0x3005, 0x3007}, {0x3021, 0x302f},
      {0x3031, 0x3035}, {0x3038, 0x303c}, {0x3041, 0x309a}, {0x309d, 0x309f}, {0x30a1, 0x30fa},
      {0x30fc, 0x318f}, {0x31a0, 0x31bf}, {0x31f0, 0x31ff}, {0x3400, 0x4dbf}, {0x4e00, 0xa48f},
      {0xa4d0, 0xa4fd}, {0xa500, 0xa60c}, {0xa610, 0xa672}, {0xa674, 0xa67d}, {0xa67f, 0xa6f1},
      {0xa717, 0xa71f}, {0xa722, 0xa788}, {0xa78b, 0xa827}, {0xa840, 0xa873}, {0xa880, 0xa8cd},
      {0xa8d0, 0xa8f7}, {0xa8fb, 0xa8fb}, {0xa8fd, 0xa92d}, {0xa930, 0xa95e}, {0xa960, 0xa9c0},
      {0xa9cf, 0xa9dd}, {0xa9e0, 0xaa5b}, {0xaa60, 0xaa76}, {0xaa7a, 0xaadd}, {0xaae0, 0xaaef},
      {0xaaf2, 0xab5a}, {0xab5c, 0xab69}, {0xab70, 0xabea}, {0xabec, 0xd7ff}, {0xf900, 0xfd3d},
      {0xfd50, 0xfdfb}, {0xfe00, 0xfe0f}, {0xfe20, 0xfe2f}, {0xfe33, 0xfe34}, {0xfe4d, 0xfe4f},
      {0xfe70, 0xfefc}, {0xff10, 0xff19}, {0xff21, 0xff3a}, {0xff3f, 0xff3f}, {0xff41, 0xff5a},
      {0xff66, 0xffbe}, {0xffc2, 0xffdc}, {0x10000, 0x1cfff}, {0x1d165, 0x1d169}, {0x1d16d, 0x1d172},
      {0x1d17b, 0x1d182}, {0x1d185, 0x1d18b}, {0x1d1aa, 0x1d1ad}, {0x1d242, 0x1d244}, {0x1d400, 0x1d6c0},
      {0x1d6c2, 0x1d6da}, {0x1d6dc, 0x1d6fa}, {0x1d6fc, 0x1d714}, {0x1d716, 0x1d734}, {0x1d736, 0x1d74e},
      {0x1d750, 0x1d76e}, {0x1d770, 0x1d788}, {0x1d78a, 0x1d7a8}, {0x1d7aa, 0x1d7c2}, {0x1d7c4, 0x1d7ff},
      {0x1d800, 0x1eeef}, {0x1f130, 0x1f149}, {0x1f150, 0x1f169}, {0x1f170, 0x1f189}, {0x1fbf0, 0x1fbf9},
      {0x20000, 0x3ffff}, {0xe0100, 0xe01ef},
  };
  size_t lo = 0, hi = sizeof(kWord) / sizeof(kWord[0]);
  while (lo < hi) {  // first range with hi >= c
    const size_t mid = (lo + hi) / 2;
    if (kWord[mid].hi < c) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < sizeof(kWord) / sizeof(kWord[0]) && kWord[lo].lo <= c;
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
