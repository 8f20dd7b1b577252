// The coalesced ops torch 2.x calls (functional collectives, DTensor, FSDP2,
// DDP's bucketing): allreduce_coalesced, allgather_coalesced,
// allgather_into_tensor_coalesced, reduce_scatter_tensor_coalesced.
//
// Each validates every member on the calling thread, then issues the member
// ops in order (they run in issue order on the group's worker, so all ranks
// run them in the same order), then queues a completion marker whose Work is
// returned: it completes after the last member, with every member's outputs
// as its result, or fails with the error that poisoned the group if any
// member failed.
#include "absl/status/status.h"
#include "collectives/process_group_tpu_dist.h"
#include "collectives/tensor_bridge.h"

namespace tpudist::collectives {

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::CompleteAfterIssued(
    const char* name, c10d::OpType type, std::chrono::milliseconds timeout,
    bool caller_waits, std::vector<at::Tensor> outputs) {
  absl::MutexLock lock(&issue_mu_);
  return Enqueue(name, type, timeout, /*bytes=*/0, caller_waits, std::move(outputs),
                 [](CollectiveBackend& comm, const OpContext&) {
                   return comm.poison_status();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  for (const at::Tensor& t : tensors) {
    ThrowIfError(ToDataType(t.scalar_type(), "allreduce_coalesced").status());
  }
  c10d::AllreduceOptions one;
  one.reduceOp = opts.reduceOp;
  one.timeout = opts.timeout;
  one.asyncOp = opts.asyncOp;
  for (at::Tensor& t : tensors) {
    std::vector<at::Tensor> single = {t};
    allreduce(single, one);
  }
  return CompleteAfterIssued("allreduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED,
                             OpTimeout(opts.timeout), !opts.asyncOp, tensors);
}

// output_lists is per rank, as torch's allgather_coalesced passes it:
// output_lists[r][i] receives rank r's inputs[i].
c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(static_cast<int>(output_lists.size()) == size_,
              "tpu_dist: allgather_coalesced: ", output_lists.size(),
              " output lists, the group has ", size_, " ranks");
  std::vector<at::Tensor> outputs;
  for (int r = 0; r < size_; ++r) {
    TORCH_CHECK(output_lists[r].size() == inputs.size(), "tpu_dist: allgather_coalesced: ",
                "output list of rank ", r, " has ", output_lists[r].size(), " tensors for ",
                inputs.size(), " inputs");
    outputs.insert(outputs.end(), output_lists[r].begin(), output_lists[r].end());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    ThrowIfError(ToDataType(inputs[i].scalar_type(), "allgather_coalesced").status());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < size_; ++r) out[0].push_back(output_lists[r][i]);
    std::vector<at::Tensor> in = {inputs[i]};
    allgather(out, in, opts);
  }
  return CompleteAfterIssued("allgather_coalesced", c10d::OpType::ALLGATHER_COALESCED,
                             OpTimeout(opts.timeout), !opts.asyncOp, std::move(outputs));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "tpu_dist: allgather_into_tensor_coalesced: ",
              outputs.size(), " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    ThrowIfError(
        ToDataType(inputs[i].scalar_type(), "allgather_into_tensor_coalesced").status());
    TORCH_CHECK(outputs[i].scalar_type() == inputs[i].scalar_type() &&
                    outputs[i].numel() == inputs[i].numel() * size_,
                "tpu_dist: allgather_into_tensor_coalesced: output ", i,
                " must hold world_size x input elements of the input dtype");
  }
  for (size_t i = 0; i < inputs.size(); ++i) _allgather_base(outputs[i], inputs[i], opts);
  return CompleteAfterIssued("allgather_into_tensor_coalesced",
                             c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED,
                             OpTimeout(opts.timeout), !opts.asyncOp, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTpuDist::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "tpu_dist: reduce_scatter_tensor_coalesced: ",
              outputs.size(), " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    ThrowIfError(
        ToDataType(outputs[i].scalar_type(), "reduce_scatter_tensor_coalesced").status());
    TORCH_CHECK(inputs[i].scalar_type() == outputs[i].scalar_type() &&
                    inputs[i].numel() == outputs[i].numel() * size_,
                "tpu_dist: reduce_scatter_tensor_coalesced: input ", i,
                " must hold world_size x output elements of the output dtype");
  }
  for (size_t i = 0; i < inputs.size(); ++i) _reduce_scatter_base(outputs[i], inputs[i], opts);
  return CompleteAfterIssued("reduce_scatter_tensor_coalesced",
                             c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED,
                             OpTimeout(opts.timeout), !opts.asyncOp, outputs);
}

}  // namespace tpudist::collectives
