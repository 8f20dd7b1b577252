// Minimal safetensors writer and reader for FullyShard checkpoints (the HF
// format: u64-LE header length, JSON header {name: {dtype, shape,
// data_offsets}, "__metadata__": {..}}, then the data block), so a full
// state dict opens in Python tools.
//
// Why not models/gemma/safetensors.h: fsdp/fully_shard sits below
// models/gemma (parallelize_gemma depends on FullyShard), so depending on the
// gemma library would create a cycle. If that writer moves to models/common
// this file should go away.
//
// Thread-safety: free functions on their arguments.
#ifndef TPU_DIST_FSDP_FULLY_SHARD_SAFETENSORS_IO_H_
#define TPU_DIST_FSDP_FULLY_SHARD_SAFETENSORS_IO_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tpudist::fsdp {

// Writes contiguous CPU copies of `tensors` to `path` via a temp file and
// rename. Supported dtypes: F64 F32 F16 BF16 I64 I32 U8 BOOL.
absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

struct SafetensorsContents {
  std::map<std::string, at::Tensor> tensors;  // owned CPU tensors
  std::map<std::string, std::string> metadata;
};

// Reads the whole file. The header is validated by
// models/common/safetensors_header.h before any tensor is allocated; errors
// (DataLoss) name the file and the offending tensor.
absl::StatusOr<SafetensorsContents> ReadSafetensorsFile(const std::string& path);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_FULLY_SHARD_SAFETENSORS_IO_H_
