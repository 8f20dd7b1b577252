// Safetensors reading and writing with torch tensors (the format of HF
// model.safetensors, FullyShard checkpoints and the oracle fixtures): the one
// reader and writer of the project.
//
// Layout: u64 little-endian N, then an N-byte JSON header
//   {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"k": "v"}}
// then the data block; offsets are relative to the data block start.
//
// SafetensorsFile maps the file (MAP_PRIVATE, copy-on-write, so writing into
// a returned tensor never touches the file) and validates the whole header on
// Open with io/safetensors_header.h: dtypes, shapes, byte sizes, bounds and
// non-overlap. Get returns a zero-copy view that keeps the mapping alive when
// the data is suitably aligned, otherwise an owned copy. ReadSafetensors is
// the whole file as owned tensors.
//
// WriteSafetensors writes through io/atomic_file.h (temp file, fsync,
// rename, fsync of the directory).
//
// Errors name the file and, where one is at fault, the tensor.
//
// Thread-safety: a SafetensorsFile is immutable after Open; Get may be called
// concurrently. The free functions share nothing; see atomic_file.h for
// writers of one path.
#ifndef TPU_DIST_IO_SAFETENSORS_H_
#define TPU_DIST_IO_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/safetensors_header.h"

namespace tpudist::io {

// "F32" <-> at::kFloat etc. Supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
absl::StatusOr<at::ScalarType> SafetensorsDtype(absl::string_view name);
absl::StatusOr<std::string> SafetensorsDtypeName(at::ScalarType type);

class SafetensorsFile {
 public:
  // Maps and validates `path`. Errors name the file and, where one is at
  // fault, the tensor.
  static absl::StatusOr<std::shared_ptr<const SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool Contains(const std::string& name) const { return entries_.count(name) != 0; }

  // The tensor `name` as stored (dtype and shape from the header). NotFound
  // names the file and tensor.
  absl::StatusOr<at::Tensor> Get(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  struct Mapping;

  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  const uint8_t* data_ = nullptr;  // start of the data block inside the mapping
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A whole file read into owned, contiguous CPU tensors.
struct SafetensorsContents {
  std::map<std::string, at::Tensor> tensors;  // name -> tensor, dtype and shape as stored
  std::map<std::string, std::string> metadata;
};

// Reads and validates the whole of `path` (as Open does) and copies every
// tensor out, so nothing refers to the file afterwards.
absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path);

// Writes `tensors` (any device/layout/shape; copied to contiguous CPU) and
// `metadata` to `path` atomically and durably (io/atomic_file.h). Names must
// be unique (InvalidArgument naming the file and tensor, nothing written);
// the JSON header is space-padded to a multiple of 8 bytes.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace tpudist::io

#endif  // TPU_DIST_IO_SAFETENSORS_H_
