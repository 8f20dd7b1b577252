#include "bench/collective_case.h"

#include <benchmark/benchmark.h>

#include <cstring>

namespace tpudist::bench {

Buffers MakeBuffers(CollectiveOp op, int64_t bytes, at::ScalarType dtype, int world, int rank) {
  const int64_t numel = bytes / static_cast<int64_t>(c10::elementSize(dtype));
  Buffers b;
  const auto opts = at::TensorOptions().dtype(dtype);
  switch (op) {
    case CollectiveOp::kAllGather:
      b.in = at::full({numel / world}, rank + 1, opts);
      b.out = at::zeros({numel}, opts);
      b.out_views = b.out.chunk(world);
      break;
    case CollectiveOp::kReduceScatter:
      b.in = at::full({numel}, rank + 1, opts);
      b.out = at::zeros({numel / world}, opts);
      b.in_views = b.in.chunk(world);
      break;
    case CollectiveOp::kAllToAll:
      b.in = at::full({numel}, rank + 1, opts);
      b.out = at::zeros({numel}, opts);
      break;
    default:  // all_reduce, broadcast: in place; memcpy: in -> out
      b.in = at::full({numel}, rank == 0 ? 1 : 0, opts);
      b.out = at::zeros({numel}, opts);
      break;
  }
  return b;
}

void RunOp(c10d::Backend& pg, bool is_gloo, CollectiveOp op, Buffers& b) {
  std::vector<at::Tensor> one = {b.in};
  switch (op) {
    case CollectiveOp::kAllReduce: {
      c10d::AllreduceOptions o;
      o.asyncOp = false;
      pg.allreduce(one, o)->wait();
      break;
    }
    case CollectiveOp::kAllGather: {
      c10d::AllgatherOptions o;
      o.asyncOp = false;
      if (is_gloo) {
        std::vector<std::vector<at::Tensor>> outs = {b.out_views};
        pg.allgather(outs, one, o)->wait();
      } else {
        pg._allgather_base(b.out, b.in, o)->wait();
      }
      break;
    }
    case CollectiveOp::kReduceScatter: {
      c10d::ReduceScatterOptions o;
      o.asyncOp = false;
      if (is_gloo) {
        std::vector<at::Tensor> out = {b.out};
        std::vector<std::vector<at::Tensor>> ins = {b.in_views};
        pg.reduce_scatter(out, ins, o)->wait();
      } else {
        pg._reduce_scatter_base(b.out, b.in, o)->wait();
      }
      break;
    }
    case CollectiveOp::kBroadcast: {
      c10d::BroadcastOptions o;
      o.asyncOp = false;
      pg.broadcast(one, o)->wait();
      break;
    }
    case CollectiveOp::kAllToAll: {
      c10d::AllToAllOptions o;
      o.asyncOp = false;
      std::vector<int64_t> even;
      pg.alltoall_base(b.out, b.in, even, even, o)->wait();
      break;
    }
    case CollectiveOp::kMemcpy:
      std::memcpy(b.out.data_ptr(), b.in.data_ptr(), b.in.nbytes());
      benchmark::DoNotOptimize(b.out.data_ptr());
      benchmark::ClobberMemory();
      break;
  }
}

int64_t SettleGroup(c10d::Backend& pg, int rank, std::chrono::milliseconds duration) {
  const auto end = std::chrono::steady_clock::now() + duration;
  at::Tensor flag = at::zeros({2}, at::kFloat);  // 8 bytes: {go on, unused}
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MAX;
  o.asyncOp = false;
  int64_t ops = 0;
  for (;;) {
    flag.zero_();
    if (rank == 0 && std::chrono::steady_clock::now() < end) flag.fill_(1.0f);
    std::vector<at::Tensor> one = {flag};
    pg.allreduce(one, o)->wait();
    ++ops;
    if (flag[0].item<float>() == 0.0f) return ops;
  }
}

void WaitedBarrier(c10d::Backend& pg) {
  c10d::BarrierOptions o;
  o.asyncOp = false;
  pg.barrier(o)->wait();
}

}  // namespace tpudist::bench
