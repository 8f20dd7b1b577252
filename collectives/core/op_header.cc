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

namespace {

// Folds a word in with one multiply (rotating first, so equal words at
// different positions do not cancel); Finish mixes the result through
// splitmix64's finalizer.
uint64_t Mix(uint64_t h, uint64_t v) {
  return ((h << 23) | (h >> 41)) ^ (v * 0x9e3779b97f4a7c15ull);
}

uint64_t Finish(uint64_t h) {
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

}  // namespace

uint64_t HeaderDigest(const OpHeader& h) {
  uint64_t d = Mix(0x7470756469676573ull, (uint64_t{h.op} << 32) | h.op_seq);
  d = Mix(d, (uint64_t{h.dtype} << 40) | (uint64_t{h.reduce} << 32) |
                 static_cast<uint32_t>(h.root));
  if (h.check_count) {
    d = Mix(d, static_cast<uint64_t>(h.count));
    d = Mix(d, h.ndim);
    for (int i = 0; i < h.ndim && i < OpHeader::kMaxDims; ++i) {
      d = Mix(d, static_cast<uint64_t>(h.dims[i]));
    }
  }
  d = Finish(d);
  return d == 0 ? 1 : d;
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
