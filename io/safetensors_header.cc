#include "io/safetensors_header.h"

#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tpudist::io {
namespace {

struct DtypeRow {
  const char* name;
  size_t bytes;
};
constexpr DtypeRow kDtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
    {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1},
};

absl::Status Corrupt(absl::string_view path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": corrupt safetensors file: ", what));
}

}  // namespace

absl::StatusOr<size_t> SafetensorsDtypeSize(absl::string_view dtype) {
  for (const auto& row : kDtypes) {
    if (dtype == row.name) return row.bytes;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported safetensors dtype '", dtype, "'"));
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view file,
                                                         absl::string_view path) {
  const uint64_t size = file.size();
  if (size < 8) {
    return Corrupt(path, absl::StrCat("file is ", size, " bytes, shorter than the 8-byte header length"));
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(file.data());
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxSafetensorsHeaderBytes || header_len > size - 8) {
    return Corrupt(path, absl::StrCat("header length ", header_len, " exceeds file size ", size));
  }
  const nlohmann::json header =
      nlohmann::json::parse(bytes + 8, bytes + 8 + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return Corrupt(path, "header is not a JSON object");

  SafetensorsHeader out;
  out.data_offset = 8 + header_len;
  out.data_size = size - out.data_offset;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Corrupt(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (m.value().is_string()) out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](absl::string_view what) { return Corrupt(path, absl::StrCat("tensor '", name, "': ", what)); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
      return bad("entry needs dtype, shape and data_offsets");
    }
    SafetensorsEntry e;
    if (!v["dtype"].is_string()) return bad("dtype is not a string");
    e.dtype = v["dtype"].get<std::string>();
    absl::StatusOr<size_t> element_size = SafetensorsDtypeSize(e.dtype);
    if (!element_size.ok()) return bad(element_size.status().message());
    if (!v["shape"].is_array()) return bad("shape is not a list");
    // shape x dtype bytes; past 2^64 (`overflow`, unless a later dim is 0) no
    // range can hold it, and a wrapped product must not be compared.
    uint64_t want = *element_size;
    bool overflow = false;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return bad("shape has a non-integer or negative dim");
      e.shape.push_back(d.get<int64_t>());
      if (e.shape.back() == 0) {
        want = 0;
        overflow = false;
      } else if (!overflow) {
        overflow = __builtin_mul_overflow(want, static_cast<uint64_t>(e.shape.back()), &want);
      }
    }
    if (overflow) return bad("shape x dtype size exceeds 2^64 bytes");
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return bad("data_offsets must be two non-negative integers");
    }
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.begin > e.end || e.end > out.data_size) {
      return bad(absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] outside data block of ", out.data_size,
                              " bytes"));
    }
    if (e.end - e.begin != want) {
      return bad(absl::StrCat("holds ", e.end - e.begin, " bytes, shape and dtype need ", want));
    }
    ranges.emplace_back(e.begin, e.end);
    out.entries.emplace(name, std::move(e));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return Corrupt(path, "tensor data ranges overlap");
  }
  return out;
}

}  // namespace tpudist::io
