// The on-disk layout of a torch DCP checkpoint in DCP's Hugging Face
// safetensors storage (torch.distributed.checkpoint.HuggingFaceStorageWriter
// with save_distributed=True / HuggingFaceStorageReader, torch 2.15), as
// plain data: file names, the sharding record in each file's header, and the
// index a reader builds from all files. Pure functions, thread-safe.
//
// A checkpoint is a directory of safetensors files, one per saving rank r
// that holds anything: "shard-<r+1, 5 digits>-model-00001-of-00001.safetensors".
// Each holds that rank's chunks, one tensor per state-dict key (a chunk is
// the box full[offsets[0] : offsets[0] + shape[0], ...]), and its header's
// "__metadata__" has
//   "DCP_SHARDING_INFO": JSON {"<key>": {"saved_offsets": [o0, o1, ...]}, ...}
//   "DCP_VERSION": "1.0", "format": "pt".
// There is no index file and no .metadata: torch's reader opens every
// *.safetensors in the directory, takes a key's full shape as the largest
// offset + size per dim over its chunks, and a key without sharding info as
// a chunk at offset 0 (so a plain or consolidated HF file reads too).
//
// Keys: model parameters and buffers by FQN (get_model_state_dict); AdamW
// state as DCP flattens {"optim": {"state": get_optimizer_state_dict()
// ["state"]}}: "optim.state.<FQN>.{step,exp_avg,exp_avg_sq[,max_exp_avg_sq]}",
// step a 0-d float32 tensor stored once. Non-tensor values (param_groups)
// are not stored: safetensors has only tensors.
#ifndef TPU_DIST_FSDP_FULLY_SHARD_DCP_LAYOUT_H_
#define TPU_DIST_FSDP_FULLY_SHARD_DCP_LAYOUT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "fsdp/fully_shard/shard_blocks.h"
#include "io/safetensors_header.h"

namespace tpudist::fsdp {

inline constexpr char kDcpShardingInfoKey[] = "DCP_SHARDING_INFO";
inline constexpr char kDcpOptimizerStatePrefix[] = "optim.state.";

// "shard-00003-model-00001-of-00001.safetensors" for rank 2: the name
// torch's writer gives rank r's file (its plan index r + 1).
std::string DcpShardFileName(int64_t rank);

// The header metadata of one file: DCP_SHARDING_INFO from (key, offsets)
// pairs, DCP_VERSION "1.0", format "pt".
std::map<std::string, std::string> DcpFileMetadata(
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& offsets);

// One file's header, as io/safetensors_header.h parses it.
struct DcpFileView {
  std::string path;
  std::map<std::string, io::SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
};

struct DcpChunk {
  size_t file = 0;  // index into the files passed to BuildDcpIndex
  Block block;      // where the stored tensor sits in the full tensor
};

struct DcpTensorIndex {
  std::vector<int64_t> shape;  // full: largest offset + size per dim
  std::string dtype;           // safetensors dtype name ("F32")
  std::vector<DcpChunk> chunks;
};

// Every key of `files` with its chunks. Chunks identical to an earlier one
// (a replica written twice) are kept once. DataLoss names the file (and the
// key) for malformed sharding info (not JSON, offsets of the wrong rank or
// negative), a dtype that differs between files, or chunks that overlap or
// leave part of the full tensor uncovered.
absl::StatusOr<std::map<std::string, DcpTensorIndex>> BuildDcpIndex(const std::vector<DcpFileView>& files);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_FULLY_SHARD_DCP_LAYOUT_H_
