// Ring all-reduce over TcpMesh vs c10d::ProcessGroupGloo, 2 ranks as threads
// of this process over loopback. Gloo is the oracle for the result (for two
// ranks a + b is exact in either order, so results must match bitwise); the
// timings are printed for the report only. No timing assertions: the real
// benchmark lives in bench/.

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/time/clock.h"
#include "collectives/tcp/ring_algorithms.h"
#include "collectives/tcp/tcp_mesh.h"
#include "collectives/tcp/test_util.h"
#include "gtest/gtest.h"

namespace tpudist::collectives::tcp {
namespace {

constexpr int kWorld = 2;

struct Timing {
  double bulk_ms = 0;     // mean per 16 MiB all-reduce
  double latency_us = 0;  // mean per 8 B all-reduce
};

TEST(TcpGlooCompareTest, AllReduce16MiBAnd8BytesMatchesGloo) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  TcpMeshOptions options;
  options.group_key = testing::UniqueKey("gloo-compare");
  auto meshes = testing::ConnectAll(*store, kWorld, options);
  ASSERT_TRUE(meshes.ok()) << meshes.status();

  constexpr int64_t kNumel = (16 << 20) / 4;  // 16 MiB of fp32
  constexpr int kBulkIters = 5, kLatIters = 300;
  std::vector<at::Tensor> inputs(kWorld);  // each [kNumel] fp32
  for (int r = 0; r < kWorld; ++r) {
    at::manual_seed(100 + r);
    inputs[r] = at::randn({kNumel});
  }
  std::vector<at::Tensor> ours(kWorld), gloo(kWorld);  // each [kNumel]
  std::vector<Timing> tcp_t(kWorld), gloo_t(kWorld);

  testing::RunRanks(kWorld, [&](int r) {
    TcpMesh& mesh = *(*meshes)[r];
    auto reduce = testing::SumReducer<float>();
    auto run = [&](at::Tensor& t) {
      absl::Span<uint8_t> bytes(static_cast<uint8_t*>(t.data_ptr()), t.nbytes());
      return RingAllReduce(mesh, bytes, sizeof(float), reduce, absl::Now() + absl::Seconds(60));
    };
    ours[r] = inputs[r].clone();
    ASSERT_TRUE(run(ours[r]).ok());
    at::Tensor bulk = inputs[r].clone();  // [kNumel]
    absl::Time t0 = absl::Now();
    for (int i = 0; i < kBulkIters; ++i) ASSERT_TRUE(run(bulk).ok());
    tcp_t[r].bulk_ms = absl::ToDoubleMilliseconds(absl::Now() - t0) / kBulkIters;
    at::Tensor small = at::ones({2});  // [2] = 8 bytes
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(run(small).ok());
    t0 = absl::Now();
    for (int i = 0; i < kLatIters; ++i) ASSERT_TRUE(run(small).ok());
    tcp_t[r].latency_us = absl::ToDoubleMicroseconds(absl::Now() - t0) / kLatIters;
  });

  testing::RunRanks(kWorld, [&](int r) {
    auto gloo_opts = c10d::ProcessGroupGloo::Options::create();
    gloo_opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    gloo_opts->timeout = std::chrono::seconds(60);
    auto prefix = c10::make_intrusive<c10d::PrefixStore>(options.group_key + "/gloo", store);
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefix, r, kWorld, gloo_opts);
    auto run = [&](at::Tensor& t) {
      std::vector<at::Tensor> v = {t};
      pg->allreduce(v)->wait();
    };
    gloo[r] = inputs[r].clone();
    run(gloo[r]);
    at::Tensor bulk = inputs[r].clone();  // [kNumel]
    absl::Time t0 = absl::Now();
    for (int i = 0; i < kBulkIters; ++i) run(bulk);
    gloo_t[r].bulk_ms = absl::ToDoubleMilliseconds(absl::Now() - t0) / kBulkIters;
    at::Tensor small = at::ones({2});  // [2]
    for (int i = 0; i < 10; ++i) run(small);
    t0 = absl::Now();
    for (int i = 0; i < kLatIters; ++i) run(small);
    gloo_t[r].latency_us = absl::ToDoubleMicroseconds(absl::Now() - t0) / kLatIters;
  });

  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(at::equal(ours[r], gloo[r])) << "rank " << r << " differs from Gloo";
    EXPECT_TRUE(at::equal(ours[r], inputs[0] + inputs[1]));
  }
  auto report = [](const char* name, const std::vector<Timing>& t) {
    double bulk = std::max(t[0].bulk_ms, t[1].bulk_ms);
    double lat = std::max(t[0].latency_us, t[1].latency_us);
    double algbw = (16.0 * (1 << 20)) / (bulk * 1e-3) / 1e9;
    std::printf("[tcp-vs-gloo] %-8s 16 MiB fp32 all-reduce W=2: %.2f ms, algBw %.2f GB/s, "
                "busBw %.2f GB/s; 8 B all-reduce latency %.1f us\n",
                name, bulk, algbw, algbw * 2 * (kWorld - 1) / kWorld, lat);
  };
  report("TcpMesh", tcp_t);
  report("Gloo", gloo_t);
}

}  // namespace
}  // namespace tpudist::collectives::tcp
