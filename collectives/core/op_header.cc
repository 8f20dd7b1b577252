#include "collectives/core/op_header.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tpudist::collectives {

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kReduce: return "reduce";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAlltoall: return "alltoall";
    case OpKind::kBarrier: return "barrier";
  }
  return "unknown-op";
}

std::string DescribeHeader(const OpHeader& h) {
  std::string dims;
  for (int i = 0; i < h.ndim && i < OpHeader::kMaxDims; ++i) {
    absl::StrAppend(&dims, i ? "," : "", h.dims[i]);
  }
  return absl::StrCat(OpKindName(static_cast<OpKind>(h.op)), " #", h.op_seq,
                      " dtype=", DataTypeName(static_cast<DataType>(h.dtype)),
                      " shape=[", dims, "] count=", h.count,
                      h.reduce ? absl::StrCat(" op=", ReduceKindName(
                                     static_cast<ReduceKind>(h.reduce)))
                               : std::string(),
                      h.root >= 0 ? absl::StrCat(" root=", h.root) : "");
}

bool HeadersAgree(const OpHeader& a, const OpHeader& b) {
  if (a.op != b.op || a.op_seq != b.op_seq || a.dtype != b.dtype ||
      a.reduce != b.reduce || a.root != b.root) {
    return false;
  }
  if (!a.check_count || !b.check_count) return true;
  if (a.count != b.count || a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim && i < OpHeader::kMaxDims; ++i) {
    if (a.dims[i] != b.dims[i]) return false;
  }
  return true;
}

OpHeader MakeHeader(const OpSpec& spec, OpKind kind, ReduceKind op, int root,
                    bool check_count) {
  OpHeader h;
  h.op = static_cast<uint32_t>(kind);
  h.op_seq = spec.seq;
  h.dtype = static_cast<uint8_t>(spec.dtype);
  h.reduce = static_cast<uint8_t>(op);
  h.check_count = check_count ? 1 : 0;
  h.root = root;
  h.count = spec.count;
  h.ndim = static_cast<uint8_t>(
      std::min<size_t>(spec.shape.size(), OpHeader::kMaxDims));
  for (int i = 0; i < h.ndim; ++i) h.dims[i] = spec.shape[i];
  return h;
}

}  // namespace tpudist::collectives
