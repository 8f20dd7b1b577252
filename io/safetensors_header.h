// The header of a safetensors file (the format of HF model.safetensors),
// parsed and validated without libtorch, so that every reader shares one
// parser and the fuzz build (fuzz/) exercises it with no libtorch at all.
//
// Layout: u64 little-endian N, then an N-byte JSON header
//   {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"k": "v"}}
// then the data block; offsets are relative to the data block start.
//
// ParseSafetensorsHeader checks everything a reader relies on before it
// touches the data: the header length against the file size, the JSON shape
// of every entry, the dtype, that shape x dtype size is exactly the entry's
// byte range (without overflow), that every range lies inside the data block,
// and that no two ranges overlap. Every error is DataLoss and names the file
// and, where one is at fault, the tensor and the field.
//
// Torch-free and includes nothing of ours: fuzz/ compiles this file pair
// alone (tools/fuzz.sh). io/safetensors.h builds torch tensors on top.
//
// Thread-safety: pure functions.
#ifndef TPU_DIST_IO_SAFETENSORS_HEADER_H_
#define TPU_DIST_IO_SAFETENSORS_HEADER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tpudist::io {

// Largest JSON header accepted (HF's limit is the same 100 MB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

struct SafetensorsEntry {
  std::string dtype;           // e.g. "BF16"
  std::vector<int64_t> shape;  // may be empty (scalar); every dim >= 0
  uint64_t begin = 0;          // byte offsets into the data block
  uint64_t end = 0;            // begin <= end <= data_size
};

struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> entries;
  // "__metadata__"'s string values (others are ignored).
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // 8 + header length: where the data block starts
  uint64_t data_size = 0;    // bytes from data_offset to the end of the file
};

// Bytes per element of a safetensors dtype name: F64 F32 F16 BF16 I64 I32 I16
// I8 U8 BOOL. InvalidArgument for anything else.
absl::StatusOr<size_t> SafetensorsDtypeSize(absl::string_view dtype);

// Parses the header of `file`, the complete contents of a safetensors file
// (the data block is only measured, never read). `path` names the file in
// errors.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view file,
                                                         absl::string_view path);

}  // namespace tpudist::io

#endif  // TPU_DIST_IO_SAFETENSORS_HEADER_H_
