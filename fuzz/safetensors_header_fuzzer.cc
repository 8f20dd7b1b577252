// Fuzz target: io/safetensors_header.h, the parser the safetensors reader
// (io/safetensors.h: SafetensorsFile::Open, ReadSafetensors) runs on a
// file's bytes before touching its data.
//
// Input: the whole file (8-byte length, JSON header, data block). On success
// the header must describe only bytes that exist: each entry's range inside
// the data block, exactly shape x dtype bytes long (computed here without
// overflow), no two ranges overlapping.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_check.h"
#include "io/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace io = tpudist::io;
  const absl::string_view file(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<io::SafetensorsHeader> header = io::ParseSafetensorsHeader(file, "fuzz.safetensors");
  if (!header.ok()) {
    FUZZ_CHECK(header.status().code() == absl::StatusCode::kDataLoss, "%s",
               header.status().ToString().c_str());
    FUZZ_CHECK(header.status().message().find("fuzz.safetensors") != absl::string_view::npos,
               "error does not name the file: %s", header.status().ToString().c_str());
    return 0;
  }
  FUZZ_CHECK(header->data_offset >= 8 && header->data_offset + header->data_size == size,
             "data block [%llu, +%llu) of a %zu-byte file", (unsigned long long)header->data_offset,
             (unsigned long long)header->data_size, size);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, e] : header->entries) {
    absl::StatusOr<size_t> element = io::SafetensorsDtypeSize(e.dtype);
    FUZZ_CHECK(element.ok(), "tensor '%s' has dtype '%s'", name.c_str(), e.dtype.c_str());
    FUZZ_CHECK(e.begin <= e.end && e.end <= header->data_size, "tensor '%s' range [%llu, %llu) of %llu",
               name.c_str(), (unsigned long long)e.begin, (unsigned long long)e.end,
               (unsigned long long)header->data_size);
    // shape x dtype in 128 bits, saturating at 2^64: what a reader allocates.
    unsigned __int128 bytes = *element;
    for (int64_t d : e.shape) {
      FUZZ_CHECK(d >= 0, "tensor '%s' has a negative dim", name.c_str());
      bytes = std::min<unsigned __int128>(bytes * static_cast<uint64_t>(d), static_cast<unsigned __int128>(1) << 64);
    }
    FUZZ_CHECK(bytes == e.end - e.begin, "tensor '%s': shape x dtype is %.0f bytes, its range %llu", name.c_str(),
               static_cast<double>(bytes), (unsigned long long)(e.end - e.begin));
    ranges.emplace_back(e.begin, e.end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    FUZZ_CHECK(ranges[i].first >= ranges[i - 1].second, "ranges overlap");
  }
  return 0;
}
