// FuzzInput: reads typed values off a fuzzer's byte string, front to back.
// Like LLVM's FuzzedDataProvider, but ours, so that the gcc-built replay test
// (fuzz/replay_main.cc) compiles the fuzz targets without clang's headers.
//
// Every read succeeds: once the bytes run out, reads return zeros / empty
// strings, so a target never has to check for the end mid-decode (it checks
// empty() to stop its loop).
//
// Thread-safety: none needed (one per input).
#ifndef TPU_DIST_FUZZ_FUZZ_INPUT_H_
#define TPU_DIST_FUZZ_FUZZ_INPUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace tpudist::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size)
      : rest_(reinterpret_cast<const char*>(data), size) {}

  bool empty() const { return rest_.empty(); }
  size_t remaining() const { return rest_.size(); }

  // The next byte, or 0 when none is left.
  uint8_t Byte() {
    if (rest_.empty()) return 0;
    const uint8_t b = static_cast<uint8_t>(rest_.front());
    rest_.remove_prefix(1);
    return b;
  }
  bool Bool() { return (Byte() & 1) != 0; }

  // The next 8 bytes (fewer when short) as a little-endian integer.
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8 && !rest_.empty(); ++i) v |= static_cast<uint64_t>(Byte()) << (8 * i);
    return v;
  }

  // An integer in [lo, hi] from one byte (ranges up to 256 values) or from
  // eight (wider ranges). REQUIRES: lo <= hi.
  int64_t IntInRange(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
    const uint64_t raw = span < 256 ? Byte() : U64();
    const uint64_t offset = span == UINT64_MAX ? raw : raw % (span + 1);
    return static_cast<int64_t>(static_cast<uint64_t>(lo) + offset);
  }

  // A string of up to `max_len` bytes: a length byte, then that many bytes
  // (fewer at the end of the input).
  std::string String(size_t max_len) {
    const size_t n = std::min<size_t>(Byte(), max_len);
    return Take(n);
  }

  // The bytes up to (not including) the next `delimiter`, which is consumed;
  // everything left when there is none.
  std::string Until(char delimiter) {
    const size_t at = rest_.find(delimiter);
    std::string out(rest_.substr(0, at));
    rest_.remove_prefix(at == absl::string_view::npos ? rest_.size() : at + 1);
    return out;
  }

  // Everything not read yet.
  absl::string_view Rest() {
    absl::string_view out = rest_;
    rest_ = absl::string_view();
    return out;
  }

 private:
  std::string Take(size_t n) {
    n = std::min(n, rest_.size());
    std::string out(rest_.substr(0, n));
    rest_.remove_prefix(n);
    return out;
  }

  absl::string_view rest_;
};

}  // namespace tpudist::fuzz

#endif  // TPU_DIST_FUZZ_FUZZ_INPUT_H_
