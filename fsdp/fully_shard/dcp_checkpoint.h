// torch DCP interop: a FullyShard-ed model (and its AdamW state) saved as a
// checkpoint that torch.distributed.checkpoint.load reads into torch's FSDP2
// at any world size, and the same layout, written by torch's dcp.save from
// FSDP2 at any world size, loaded back. The layout is DCP's Hugging Face
// safetensors storage (dcp_layout.h has the files and keys; docs/fsdp.md,
// "DCP interop", says why this route and not DCP's default .distcp one).
//
// Torch side, saving (the writer torch must use; its default FileSystemWriter
// layout, a pickled .metadata + torch.save'd .distcp items, is not read):
//
//   from torch.distributed.checkpoint import HuggingFaceStorageWriter
//   osd = get_optimizer_state_dict(model, opt)
//   dcp.save({**get_model_state_dict(model), "optim": {"state": osd["state"]}},
//            storage_writer=HuggingFaceStorageWriter(path, save_distributed=True))
//
// and loading what SaveDcpCheckpoint wrote:
//
//   state = {**get_model_state_dict(model), "optim": {"state": osd["state"]}}
//   dcp.load(state, storage_reader=HuggingFaceStorageReader(path))
//   optim = state.pop("optim"); set_model_state_dict(model, state)
//   set_optimizer_state_dict(model, opt, {"state": optim["state"],
//                                         "param_groups": osd["param_groups"]})
//
// (param_groups, i.e. lr/betas/eps/weight_decay, are not stored: each side
// keeps its own.) Without "optim" in the dict only the weights move.
//
// Both functions are collective over `mesh` (the mesh over every rank that
// holds a piece: for TP x FSDP the 2-D one) and end with an agreement on
// the status, so every rank returns OK or every rank an error (Aborted on
// the ranks that did not fail themselves). `dir` is on a filesystem every
// rank sees. REQUIRES: parameters sharded (between steps); `optimizer`, when
// given, built over model->parameters().
#ifndef TPU_DIST_FSDP_FULLY_SHARD_DCP_CHECKPOINT_H_
#define TPU_DIST_FSDP_FULLY_SHARD_DCP_CHECKPOINT_H_

#include <memory>
#include <string>

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include "absl/status/status.h"
#include "fsdp/device_mesh.h"
#include "fsdp/fully_shard/state_dict.h"

namespace tpudist::fsdp {

// Each rank writes its blocks (the same blocks as SaveShardedCheckpoint:
// FullyShard rows, TP pieces, replicas once, unsharded tensors from rank 0)
// to dir/DcpShardFileName(rank) with their offsets; a rank with nothing to
// write writes no file. With `optimizer`, every parameter that has AdamW
// state also gets "optim.state.<FQN>.exp_avg" / ".exp_avg_sq" (and
// ".max_exp_avg_sq" with amsgrad) in the same blocks, and ".step" (0-d
// float32, from the rank holding the block at offset 0); parameters that
// have no state yet (never stepped) are absent, so torch's load of "optim"
// needs a checkpoint taken after the first step. Frozen parameters are
// skipped with options.ignore_frozen_params (only that flag is read).
// `dir` must exist and hold no *.safetensors file (torch's reader reads every
// one): FailedPrecondition naming it, before anything is written. Files are
// written with io/atomic_file.h (temp, fsync, rename); the directory is
// complete once every rank returned OK.
absl::Status SaveDcpCheckpoint(const std::shared_ptr<torch::nn::Module>& model, const DeviceMesh& mesh,
                               const std::string& dir, torch::optim::AdamW* optimizer = nullptr,
                               const StateDictOptions& options = {});

// Reads every *.safetensors in `dir` (a directory torch's
// HuggingFaceStorageWriter(save_distributed=True) or SaveDcpCheckpoint wrote,
// at any world size; a plain HF safetensors file reads as whole tensors),
// and copies into each parameter and buffer the intersection of its block
// on this rank with every saved chunk, casting to the parameter's dtype.
// With `optimizer`, every trainable parameter's AdamW state is replaced by
// the checkpoint's (exp_avg, exp_avg_sq, max_exp_avg_sq if present, step).
// NotFound: no *.safetensors in `dir`, or a trainable parameter (or, with
// `optimizer`, its state) missing; frozen parameters and buffers that are
// missing keep their values. InvalidArgument names a key whose full shape
// differs from the model's; DataLoss names the file of an inconsistent
// checkpoint (dcp_layout.h BuildDcpIndex) or a step that is not a whole
// number. Reads only: each rank maps the files and copies what it needs.
absl::Status LoadDcpCheckpoint(const std::shared_ptr<torch::nn::Module>& model, const DeviceMesh& mesh,
                               const std::string& dir, torch::optim::AdamW* optimizer = nullptr);

// Whether `dir` (as LoadDcpCheckpoint reads it) holds any
// "optim.state." key. Reads the headers only; every rank gets the same
// answer from the same files. Errors as LoadDcpCheckpoint's for the files.
absl::StatusOr<bool> DcpCheckpointHasOptimizerState(const std::string& dir);

}  // namespace tpudist::fsdp

#endif  // TPU_DIST_FSDP_FULLY_SHARD_DCP_CHECKPOINT_H_
