// ProcessGroupTpuDist with ranks as threads over one c10d::HashStore. The
// oracle is the single-process computation: every thread can rebuild every
// rank's (deterministic) input and computes the expected result itself.
#include <ATen/ATen.h>

#include <thread>
#include <tuple>

#include "collectives/process_group_tpu_dist.h"
#include "testing/collectives_util.h"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::collectives {
namespace {

using test_support::RunRankThreads;
using test_support::SmallOptions;
using test_support::UniqueJob;

// Rank r's input: small integers (exact in every dtype), shifted per rank
// and salt. [n]
at::Tensor Input(int rank, int64_t n, at::ScalarType type, int salt = 0) {
  at::Tensor base = (at::arange(n, at::kLong) * 7 + rank * 13 + salt) % 11;
  if (type != at::kByte) base = base - 5;
  at::Tensor t = base.to(type);
  if (at::isFloatingType(type)) t = t + 0.25 * rank;
  return t;
}

// Inputs for PRODUCT: values in {-1, 0, 1, 2} so 16-way products stay exact.
at::Tensor ProductInput(int rank, int64_t n, at::ScalarType type) {
  at::Tensor base = (at::arange(n, at::kLong) + rank) % 4 - 1;
  if (type == at::kByte) base = base.abs();
  return base.to(type);
}

// Reduction oracle in rank order; 16-bit floats accumulate in fp32 and round
// once, as the kernels do.
at::Tensor Oracle(const std::vector<at::Tensor>& ins, c10d::ReduceOp::RedOpType op) {
  const at::ScalarType type = ins[0].scalar_type();
  const bool widen = type == at::kBFloat16 || type == at::kHalf;
  at::Tensor acc = widen ? ins[0].to(at::kFloat) : ins[0].clone();
  for (size_t r = 1; r < ins.size(); ++r) {
    at::Tensor x = widen ? ins[r].to(at::kFloat) : ins[r];
    switch (op) {
      case c10d::ReduceOp::SUM:
      case c10d::ReduceOp::AVG: acc = acc + x; break;
      case c10d::ReduceOp::PRODUCT: acc = acc * x; break;
      case c10d::ReduceOp::MIN: acc = at::minimum(acc, x); break;
      case c10d::ReduceOp::MAX: acc = at::maximum(acc, x); break;
      default: ADD_FAILURE() << "unexpected op"; break;
    }
  }
  if (op == c10d::ReduceOp::AVG) acc = acc / static_cast<double>(ins.size());
  return acc.to(type);
}

class ProcessGroupTest : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

// Every op and dtype on `world` thread ranks vs the single-process oracle.
// hosts: "" = one host; else hosts[r] names rank r's emulated host (its
// host id), e.g. "0011" = 2 hosts x 2 ranks, "0101" = non-contiguous.
void RunEveryOp(int world, int64_t count, const std::string& hosts) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("pg");
  RunRankThreads(world, [&](int rank) {
    ProcessGroupTpuDist::Options opts = SmallOptions(job);
    if (!hosts.empty()) {
      opts.host_id = std::string("h") + hosts[rank];
      opts.bind_address = "127.0.0.1";
    }
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, world, opts);
    if (!hosts.empty()) {
      EXPECT_GT(pg->host_layout().num_hosts(), 1);
    }
    EXPECT_EQ(pg->getBackendName(), "tpu_dist");
    auto all = [&](auto make) {
      std::vector<at::Tensor> v;
      for (int r = 0; r < world; ++r) v.push_back(make(r));
      return v;
    };
    // allreduce: every dtype x {SUM, MIN, MAX}, AVG on floats, PRODUCT.
    for (at::ScalarType type : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf,
                                at::kInt, at::kLong, at::kByte}) {
      std::vector<c10d::ReduceOp::RedOpType> ops = {
          c10d::ReduceOp::SUM, c10d::ReduceOp::MIN, c10d::ReduceOp::MAX,
          c10d::ReduceOp::PRODUCT};
      if (at::isFloatingType(type)) ops.push_back(c10d::ReduceOp::AVG);
      for (auto op : ops) {
        auto make = [&](int r) {
          return op == c10d::ReduceOp::PRODUCT ? ProductInput(r, count, type)
                                               : Input(r, count, type);
        };
        std::vector<at::Tensor> t = {make(rank)};
        c10d::AllreduceOptions o;
        o.reduceOp = op;
        pg->allreduce(t, o)->wait();
        EXPECT_TRUE(at::equal(t[0], Oracle(all(make), op)))
            << "allreduce " << c10::toString(type) << " op " << int(op)
            << " rank " << rank;
      }
    }
    // allgather / _allgather_base
    {
      std::vector<at::Tensor> in = {Input(rank, count, at::kFloat)};
      std::vector<std::vector<at::Tensor>> out(1);
      for (int r = 0; r < world; ++r) out[0].push_back(at::empty({count}, at::kFloat));
      pg->allgather(out, in)->wait();
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(at::equal(out[0][r], Input(r, count, at::kFloat))) << "allgather";
      }
      at::Tensor base_in = Input(rank, count, at::kLong);
      at::Tensor base_out = at::empty({world * count}, at::kLong);
      pg->_allgather_base(base_out, base_in)->wait();
      EXPECT_TRUE(at::equal(base_out, at::cat(all([&](int r) {
                              return Input(r, count, at::kLong);
                            }))))
          << "_allgather_base";
    }
    // reduce_scatter / _reduce_scatter_base: oracle reduces the full inputs.
    {
      auto full = [&](int r, at::ScalarType type) {
        return Input(r, world * count, type, 3);
      };
      std::vector<std::vector<at::Tensor>> in(1);
      for (int j = 0; j < world; ++j) {
        in[0].push_back(full(rank, at::kFloat).narrow(0, j * count, count).clone());
      }
      std::vector<at::Tensor> out = {at::empty({count}, at::kFloat)};
      pg->reduce_scatter(out, in)->wait();
      at::Tensor expect = Oracle(all([&](int r) { return full(r, at::kFloat); }),
                                 c10d::ReduceOp::SUM);
      EXPECT_TRUE(at::equal(out[0], expect.narrow(0, rank * count, count)))
          << "reduce_scatter";
      for (at::ScalarType type : {at::kBFloat16, at::kInt, at::kDouble}) {
        at::Tensor src = full(rank, type);
        at::Tensor dst = at::empty({count}, type);
        c10d::ReduceScatterOptions o;
        o.reduceOp = type == at::kInt      ? c10d::ReduceOp::MAX
                     : type == at::kDouble ? c10d::ReduceOp::AVG
                                           : c10d::ReduceOp::SUM;
        pg->_reduce_scatter_base(dst, src, o)->wait();
        at::Tensor e = Oracle(all([&](int r) { return full(r, type); }), o.reduceOp);
        EXPECT_TRUE(at::equal(dst, e.narrow(0, rank * count, count)))
            << "_reduce_scatter_base " << c10::toString(type);
      }
    }
    // broadcast / reduce / gather / scatter with non-zero roots.
    {
      const int root = world - 1;
      std::vector<at::Tensor> t = {Input(rank, count, at::kDouble)};
      c10d::BroadcastOptions bo;
      bo.rootRank = root;
      pg->broadcast(t, bo)->wait();
      EXPECT_TRUE(at::equal(t[0], Input(root, count, at::kDouble))) << "broadcast";

      std::vector<at::Tensor> red = {Input(rank, count, at::kInt)};
      c10d::ReduceOptions ro;
      ro.rootRank = world / 2;
      pg->reduce(red, ro)->wait();
      if (rank == world / 2) {
        EXPECT_TRUE(at::equal(red[0], Oracle(all([&](int r) {
                                               return Input(r, count, at::kInt);
                                             }),
                                             c10d::ReduceOp::SUM)))
            << "reduce";
      }

      std::vector<at::Tensor> gin = {Input(rank, count, at::kHalf)};
      std::vector<std::vector<at::Tensor>> gout(rank == 0 ? 1 : 0);
      if (rank == 0) {
        for (int r = 0; r < world; ++r) gout[0].push_back(at::empty({count}, at::kHalf));
      }
      pg->gather(gout, gin)->wait();
      if (rank == 0) {
        for (int r = 0; r < world; ++r) {
          EXPECT_TRUE(at::equal(gout[0][r], Input(r, count, at::kHalf))) << "gather";
        }
      }

      std::vector<std::vector<at::Tensor>> sin(rank == root ? 1 : 0);
      if (rank == root) {
        for (int r = 0; r < world; ++r) sin[0].push_back(Input(r, count, at::kByte, 5));
      }
      std::vector<at::Tensor> sout = {at::empty({count}, at::kByte)};
      c10d::ScatterOptions so;
      so.rootRank = root;
      pg->scatter(sout, sin, so)->wait();
      EXPECT_TRUE(at::equal(sout[0], Input(rank, count, at::kByte, 5))) << "scatter";
    }
    // alltoall_base: even split, then uneven splits (rows of 3 elements).
    {
      auto rows_in = [&](int r) { return Input(r, world * count, at::kFloat, 1); };
      at::Tensor in = rows_in(rank);
      at::Tensor out = at::empty({world * count}, at::kFloat);
      std::vector<int64_t> none;
      pg->alltoall_base(out, in, none, none)->wait();
      for (int src = 0; src < world; ++src) {
        EXPECT_TRUE(at::equal(out.narrow(0, src * count, count),
                              rows_in(src).narrow(0, rank * count, count)))
            << "alltoall_base even";
      }
      auto sends = [&](int src, int dst) -> int64_t {
        // Uneven (some zero) and, for the large count, several phases long.
        return ((src + 2 * dst + count) % 5) * (1 + count / 100);
      };
      auto uneven_in = [&](int src) {
        int64_t rows = 0;
        for (int d = 0; d < world; ++d) rows += sends(src, d);
        return Input(src, rows * 3, at::kLong, 2).view({rows, 3});
      };
      std::vector<int64_t> in_split, out_split;
      int64_t out_rows = 0;
      for (int j = 0; j < world; ++j) {
        in_split.push_back(sends(rank, j));
        out_split.push_back(sends(j, rank));
        out_rows += sends(j, rank);
      }
      at::Tensor uin = uneven_in(rank);
      at::Tensor uout = at::empty({out_rows, 3}, at::kLong);
      pg->alltoall_base(uout, uin, out_split, in_split)->wait();
      int64_t at_row = 0;
      for (int src = 0; src < world; ++src) {
        int64_t off = 0;
        for (int d = 0; d < rank; ++d) off += sends(src, d);
        EXPECT_TRUE(at::equal(uout.narrow(0, at_row, sends(src, rank)),
                              uneven_in(src).narrow(0, off, sends(src, rank))))
            << "alltoall_base uneven from " << src;
        at_row += sends(src, rank);
      }
      // alltoall over tensor lists.
      std::vector<at::Tensor> lin, lout;
      for (int j = 0; j < world; ++j) {
        lin.push_back(Input(rank * world + j, count, at::kInt));
        lout.push_back(at::empty({count}, at::kInt));
      }
      pg->alltoall(lout, lin)->wait();
      for (int src = 0; src < world; ++src) {
        EXPECT_TRUE(at::equal(lout[src], Input(src * world + rank, count, at::kInt)))
            << "alltoall";
      }
    }
    // barrier, send/recv around a ring.
    pg->barrier()->wait();
    if (world > 1) {
      std::vector<at::Tensor> s = {Input(rank, count, at::kFloat, 9)};
      std::vector<at::Tensor> r = {at::empty({count}, at::kFloat)};
      const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
      auto sw = pg->send(s, next, 7);
      pg->recv(r, prev, 7)->wait();
      sw->wait();
      EXPECT_TRUE(at::equal(r[0], Input(prev, count, at::kFloat, 9))) << "send/recv";
    }
    EXPECT_TRUE(pg->status().ok()) << pg->status();
  });
  EXPECT_THAT(test_support::ShmEntries("tpud_" + job), ::testing::IsEmpty());
}

TEST_P(ProcessGroupTest, EveryOpMatchesTheOracle) {
  const auto [world, count] = GetParam();
  RunEveryOp(world, count, "");
}

// Emulated hosts in one process: every op through the hierarchical backend
// (shm per host, TCP on 127.0.0.1 between hosts).
class MultiHostTest : public ::testing::TestWithParam<std::tuple<std::string, int64_t>> {};

TEST_P(MultiHostTest, EveryOpMatchesTheOracle) {
  const auto [hosts, count] = GetParam();
  RunEveryOp(static_cast<int>(hosts.size()), count, hosts);
}

INSTANTIATE_TEST_SUITE_P(
    HostsByCount, MultiHostTest,
    ::testing::Combine(::testing::Values("0011", "001122", "00111", "0101", "0123", "01",
                                         "01120"),
                       ::testing::Values<int64_t>(0, 1, 37, 2500)),
    [](const auto& info) {
      return "hosts" + std::get<0>(info.param) + "_n" +
             std::to_string(std::get<1>(info.param));
    });

INSTANTIATE_TEST_SUITE_P(
    WorldByCount, ProcessGroupTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 8, 16),
                       ::testing::Values<int64_t>(0, 1, 37, 2500)),
    [](const auto& info) {
      return "w" + std::to_string(std::get<0>(info.param)) + "_n" +
             std::to_string(std::get<1>(info.param));
    });

TEST(ProcessGroupSingleTest, NonContiguousInputsAndFuture) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("nc");
  RunRankThreads(3, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 3, SmallOptions(job));
    // A transposed view: [5, 7] -> [7, 5] non-contiguous.
    at::Tensor base = Input(rank, 35, at::kFloat).view({5, 7});
    std::vector<at::Tensor> t = {base.t()};
    ASSERT_FALSE(t[0].is_contiguous());
    auto work = pg->allreduce(t);
    auto future = work->getFuture();
    work->wait();
    at::Tensor expect = Oracle({Input(0, 35, at::kFloat), Input(1, 35, at::kFloat),
                                Input(2, 35, at::kFloat)},
                               c10d::ReduceOp::SUM)
                            .view({5, 7})
                            .t();
    EXPECT_TRUE(at::equal(t[0], expect));
    EXPECT_TRUE(at::equal(base.t(), expect)) << "result must land in the view";
    ASSERT_TRUE(future->completed());
    auto list = future->value().toTensorList();
    ASSERT_EQ(list.size(), 1u);
    EXPECT_TRUE(at::equal(list.get(0), expect));
    // Strided input to allgather and a strided output.
    at::Tensor strided = Input(rank, 20, at::kInt).slice(0, 0, 20, 2);  // [10]
    std::vector<at::Tensor> in = {strided};
    std::vector<std::vector<at::Tensor>> out(1);
    at::Tensor holder = at::zeros({3, 10, 2}, at::kInt);
    for (int r = 0; r < 3; ++r) out[0].push_back(holder.select(0, r).select(1, 0));
    pg->allgather(out, in)->wait();
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(at::equal(holder.select(0, r).select(1, 0),
                            Input(r, 20, at::kInt).slice(0, 0, 20, 2)));
    }
  });
}

// The future is made by the first getFuture() (work.h): asked for only after
// the op ended, it comes back complete with the op's outputs, the same future
// on every call, and a callback added to it runs at once on the adder.
TEST(ProcessGroupSingleTest, FutureAskedForAfterTheOpEndedIsComplete) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("late_future");
  RunRankThreads(2, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, SmallOptions(job));
    std::vector<at::Tensor> t = {at::full({4}, static_cast<float>(rank + 1))};  // [4]
    auto work = pg->allreduce(t);
    ASSERT_TRUE(work->wait());
    auto future = work->getFuture();
    ASSERT_TRUE(future->completed());
    EXPECT_FALSE(future->hasError());
    EXPECT_EQ(future.get(), work->getFuture().get());
    auto list = future->value().toTensorList();
    ASSERT_EQ(list.size(), 1u);
    EXPECT_TRUE(at::equal(list.get(0), at::full({4}, 3.0f)));
    const std::thread::id here = std::this_thread::get_id();
    std::thread::id ran_on;
    future->addCallback([&](c10::ivalue::Future&) { ran_on = std::this_thread::get_id(); });
    EXPECT_EQ(ran_on, here);
  });
}

TEST(ProcessGroupSingleTest, OneShotAllreduceSpanningSeveralSlots) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("os");
  RunRankThreads(3, [&](int rank) {
    auto o = SmallOptions(job);
    o.small_allreduce_bytes = 1 << 20;  // one-shot even though > 4 KiB slot
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 3, o);
    for (at::ScalarType type : {at::kFloat, at::kBFloat16, at::kLong}) {
      std::vector<at::Tensor> t = {Input(rank, 5003, type)};
      pg->allreduce(t)->wait();
      EXPECT_TRUE(at::equal(t[0], Oracle({Input(0, 5003, type), Input(1, 5003, type),
                                          Input(2, 5003, type)},
                                         c10d::ReduceOp::SUM)))
          << c10::toString(type);
    }
  });
}

// FSDP-style in-place use: the input is the own slice of the output
// (_allgather_base) or the output is the own slice of the input
// (_reduce_scatter_base). Sizes span several 4 KiB slots.
TEST(ProcessGroupSingleTest, InPlaceBaseCollectives) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("ip");
  const int world = 3;
  const int64_t n = 2003;
  RunRankThreads(world, [&](int rank) {
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, world, SmallOptions(job));
    at::Tensor flat = at::zeros({world * n}, at::kFloat);
    at::Tensor mine = flat.narrow(0, rank * n, n);
    mine.copy_(Input(rank, n, at::kFloat));
    pg->_allgather_base(flat, mine)->wait();
    std::vector<at::Tensor> pieces;
    for (int r = 0; r < world; ++r) pieces.push_back(Input(r, n, at::kFloat));
    EXPECT_TRUE(at::equal(flat, at::cat(pieces)));

    auto full = [&](int r) { return Input(r, world * n, at::kFloat, 4); };
    at::Tensor in = full(rank);
    at::Tensor out = in.narrow(0, rank * n, n);
    pg->_reduce_scatter_base(out, in)->wait();
    at::Tensor expect = Oracle({full(0), full(1), full(2)}, c10d::ReduceOp::SUM);
    EXPECT_TRUE(at::equal(out, expect.narrow(0, rank * n, n)));
  });
}

// The group works over a TCPStore too (loopback, server on an ephemeral
// port chosen by the kernel).
TEST(ProcessGroupSingleTest, WorksOverTcpStore) {
  c10d::TCPStoreOptions server_opts;
  server_opts.port = 0;
  server_opts.isServer = true;
  server_opts.waitWorkers = false;
  server_opts.timeout = std::chrono::seconds(20);
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server_opts);
  const std::string job = UniqueJob("tcp");
  RunRankThreads(3, [&](int rank) {
    c10d::TCPStoreOptions o;
    o.port = server->getPort();
    o.waitWorkers = false;
    o.timeout = std::chrono::seconds(20);
    c10::intrusive_ptr<c10d::Store> store = server;
    if (rank != 0) store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 3, SmallOptions(job));
    std::vector<at::Tensor> t = {at::full({3000}, float(rank + 1), at::kFloat)};
    pg->allreduce(t)->wait();
    EXPECT_TRUE(at::equal(t[0], at::full({3000}, 6.0f)));
  });
}

TEST(ProcessGroupSingleTest, AsyncOpsRunInIssueOrder) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("ord");
  RunRankThreads(2, [&](int rank) {
    auto o = SmallOptions(job);
    o.inline_max_bytes = -1;  // every op on the worker thread
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, o);
    // Really async: rank 0's call returns while rank 1 has not joined yet.
    std::vector<at::Tensor> big = {at::ones({5000}, at::kFloat)};
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto start = std::chrono::steady_clock::now();
    auto pending = pg->allreduce(big);
    if (rank == 0) {
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
      EXPECT_FALSE(pending->isCompleted());
    }
    if (rank == 0) {
      // A short wait on a pending op times out without failing the op.
      EXPECT_THROW(pending->wait(std::chrono::milliseconds(20)), std::exception);
    }
    pending->wait();
    EXPECT_TRUE(at::equal(big[0], at::full({5000}, 2.0f)));
    EXPECT_TRUE(pending->isSuccess());
    EXPECT_EQ(pending->exception(), nullptr);
    std::vector<std::vector<at::Tensor>> bufs;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (int i = 0; i < 8; ++i) {
      bufs.push_back({at::full({100}, float(i + rank), at::kFloat)});
      works.push_back(pg->allreduce(bufs.back()));
    }
    for (int i = 0; i < 8; ++i) {
      EXPECT_TRUE(works[i]->wait(std::chrono::seconds(20)));
      EXPECT_TRUE(works[i]->isSuccess());
      EXPECT_TRUE(at::equal(bufs[i][0], at::full({100}, float(2 * i + 1), at::kFloat)));
    }
  });
}

// c10d's asyncOp decides the inline path: a small op the caller will wait on
// later (asyncOp = true, the default; FSDP's prefetch) must not block its
// issuer until the peers arrive, while one waited on at once (asyncOp =
// false, Python's async_op=False) may run on the calling thread.
TEST(ProcessGroupSingleTest, SmallOpsRunInlineOnlyWhenTheCallerWaits) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("inl");
  RunRankThreads(2, [&](int rank) {
    auto o = SmallOptions(job);
    o.timeout = std::chrono::seconds(5);  // a wrongly inlined op fails in 5 s
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, o);
    // Rank 1 joins only after rank 0's issuing calls returned: with either op
    // run inline on rank 0 this deadlocks into rank 0's op timeout.
    std::vector<at::Tensor> sum = {at::full({16}, float(rank + 1))};  // [16], 64 B
    at::Tensor in = at::full({16}, float(rank), at::kFloat);         // [16]
    at::Tensor gathered = at::zeros({32}, at::kFloat);               // [2 * 16]
    c10::intrusive_ptr<c10d::Work> reduce, gather;
    if (rank == 1) store->wait({"issued"}, std::chrono::seconds(10));
    reduce = pg->allreduce(sum);
    gather = pg->_allgather_base(gathered, in);
    if (rank == 0) store->set("issued", {1});
    EXPECT_TRUE(reduce->wait(std::chrono::seconds(10)));
    EXPECT_TRUE(gather->wait(std::chrono::seconds(10)));
    EXPECT_TRUE(at::equal(sum[0], at::full({16}, 3.0f)));
    EXPECT_TRUE(at::equal(gathered, at::cat({at::zeros({16}), at::ones({16})})));
    // Waited on at once: inline when the queue is idle, so the Work is done
    // when the call returns -- every time, also right after the worker ran
    // the async ops above (it counts as idle before it completes their
    // Works, so the woken caller does not find it busy).
    int done_on_return = 0;
    for (int i = 0; i < 20; ++i) {
      c10d::AllreduceOptions now;
      now.asyncOp = false;
      std::vector<at::Tensor> t = {at::full({16}, float(i))};  // [16]
      auto w = pg->allreduce(t, now);
      if (w->isCompleted()) ++done_on_return;
      EXPECT_TRUE(w->wait(std::chrono::seconds(10)));
      EXPECT_TRUE(at::equal(t[0], at::full({16}, 2.0f * i)));
    }
    EXPECT_EQ(done_on_return, 20);
  });
}

TEST(ProcessGroupSingleTest, SubgroupsFollowTheGivenRankOrder) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = UniqueJob("sub");
  RunRankThreads(4, [&](int rank) {
    // Two disjoint subgroups, listed in a non-sorted order.
    const std::vector<int> ranks = rank % 2 ? std::vector<int>{3, 1} : std::vector<int>{2, 0};
    auto sub = ProcessGroupTpuDist::NewSubgroup(store, rank, ranks, SmallOptions(job));
    EXPECT_EQ(sub->getSize(), 2);
    EXPECT_EQ(sub->getRank(), rank >= 2 ? 0 : 1);
    std::vector<at::Tensor> t = {at::full({5}, float(rank), at::kFloat)};
    c10d::BroadcastOptions o;
    o.rootRank = 0;  // group rank 0 = global ranks 3 and 2
    sub->broadcast(t, o)->wait();
    EXPECT_TRUE(at::equal(t[0], at::full({5}, float(ranks[0]), at::kFloat)));
    std::vector<at::Tensor> s = {at::full({3}, float(rank), at::kFloat)};
    sub->allreduce(s)->wait();
    EXPECT_TRUE(at::equal(s[0], at::full({3}, float(ranks[0] + ranks[1]), at::kFloat)));
  });
  EXPECT_THROW(ProcessGroupTpuDist::NewSubgroup(store, 5, {0, 1}, SmallOptions(job)),
               c10::Error);
}

}  // namespace
}  // namespace tpudist::collectives

namespace tpudist::collectives {
namespace {

// A pending recv must occupy neither the collective queue nor the issuer:
// (1) both ranks post irecv before isend (batch_isend_irecv's order);
// (2) rank 0 recv(src=1) then all_reduce, rank 1 all_reduce then send(dst=0).
// Both used to wait out the recv timeout (the recv sat on the op worker).
TEST(ProcessGroupP2pTest, PendingRecvBlocksNeitherCollectivesNorSends) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string job = test_support::UniqueJob("p2p");
  const auto start = std::chrono::steady_clock::now();
  test_support::RunRankThreads(2, [&](int rank) {
    ProcessGroupTpuDist::Options o = test_support::SmallOptions(job);
    o.timeout = std::chrono::seconds(10);
    auto pg = c10::make_intrusive<ProcessGroupTpuDist>(store, rank, 2, o);
    const int peer = 1 - rank;
    std::vector<at::Tensor> in = {at::empty({4})};
    std::vector<at::Tensor> out = {at::full({4}, float(rank))};
    auto r = pg->recv(in, peer, 0);
    auto s = pg->send(out, peer, 0);
    s->wait();
    r->wait();
    EXPECT_TRUE(at::equal(in[0], at::full({4}, float(peer))));

    std::vector<at::Tensor> y = {at::ones({3})};
    std::vector<at::Tensor> msg = {rank == 0 ? at::empty({2}) : at::full({2}, 7.0f)};
    if (rank == 0) {
      auto pending = pg->recv(msg, 1, 1);
      pg->allreduce(y)->wait();
      pending->wait();
      EXPECT_TRUE(at::equal(msg[0], at::full({2}, 7.0f)));
    } else {
      pg->allreduce(y)->wait();
      pg->send(msg, 0, 1)->wait();
    }
    EXPECT_TRUE(at::equal(y[0], at::full({3}, 2.0f)));
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace tpudist::collectives
