// Ring all-reduce over TcpMesh vs c10d::ProcessGroupGloo, 2 ranks as threads
// of this process over loopback. Gloo is the oracle for the result (for two
// ranks a + b is exact in either order, so results must match bitwise); the
// timings are printed for the report only. No timing assertions: the real
// benchmark lives in bench/.

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

#include "absl/time/clock.h"
#include "collectives/tcp/ring_algorithms.h"
#include "collectives/tcp/tcp_mesh.h"
#include "testing/tcp_util.h"
#include "gtest/gtest.h"

namespace tpudist::collectives::tcp {
namespace {

constexpr int kWorld = 2;

// Per-trial times of one implementation on one rank.
struct Samples {
  std::vector<double> bulk_ms;     // one 16 MiB all-reduce per trial
  std::vector<double> latency_us;  // mean of kLatIters 8 B all-reduces per trial
};

double Min(std::vector<double> v) { return *std::min_element(v.begin(), v.end()); }
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The machine is shared and loaded, so the two implementations are measured
// alternately, trial by trial, and min and median are reported.
TEST(TcpGlooCompareTest, AllReduce16MiBAnd8BytesMatchesGloo) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  TcpMeshOptions options;
  options.group_key = test_support::UniqueKey("gloo-compare");
  auto meshes = test_support::ConnectAll(*store, kWorld, options);
  ASSERT_TRUE(meshes.ok()) << meshes.status();

  constexpr int64_t kNumel = (16 << 20) / 4;  // 16 MiB of fp32
  constexpr int kTrials = 7, kLatIters = 100;
  std::vector<at::Tensor> inputs(kWorld);  // each [kNumel] fp32
  for (int r = 0; r < kWorld; ++r) {
    at::manual_seed(100 + r);
    inputs[r] = at::randn({kNumel});
  }
  std::vector<at::Tensor> ours(kWorld), gloo(kWorld);  // each [kNumel]
  std::vector<Samples> tcp_t(kWorld), gloo_t(kWorld);

  test_support::RunRankThreads(kWorld, [&](int r) {
    TcpMesh& mesh = *(*meshes)[r];
    auto reduce = test_support::SumReducer<float>();
    auto run_tcp = [&](at::Tensor& t) {
      absl::Span<uint8_t> bytes(static_cast<uint8_t*>(t.data_ptr()), t.nbytes());
      absl::Status s =
          RingAllReduce(mesh, bytes, sizeof(float), reduce, absl::Now() + absl::Seconds(60));
      ASSERT_TRUE(s.ok()) << s;
    };
    auto gloo_opts = c10d::ProcessGroupGloo::Options::create();
    gloo_opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    gloo_opts->timeout = std::chrono::seconds(60);
    auto prefix = c10::make_intrusive<c10d::PrefixStore>(options.group_key + "/gloo", store);
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefix, r, kWorld, gloo_opts);
    auto run_gloo = [&](at::Tensor& t) {
      std::vector<at::Tensor> v = {t};
      pg->allreduce(v)->wait();
    };
    ours[r] = inputs[r].clone();
    run_tcp(ours[r]);
    gloo[r] = inputs[r].clone();
    run_gloo(gloo[r]);

    at::Tensor bulk = inputs[r].clone();  // [kNumel]
    at::Tensor small = at::ones({2});     // [2] = 8 bytes
    for (int trial = 0; trial < kTrials; ++trial) {
      for (int impl = 0; impl < 2; ++impl) {
        Samples& out = impl == 0 ? tcp_t[r] : gloo_t[r];
        auto run = [&](at::Tensor& t) { impl == 0 ? run_tcp(t) : run_gloo(t); };
        absl::Time t0 = absl::Now();
        run(bulk);
        out.bulk_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
        t0 = absl::Now();
        for (int i = 0; i < kLatIters; ++i) run(small);
        out.latency_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0) / kLatIters);
      }
    }
  });

  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(at::equal(ours[r], gloo[r])) << "rank " << r << " differs from Gloo";
    EXPECT_TRUE(at::equal(ours[r], inputs[0] + inputs[1]));
  }
  auto report = [](const char* name, const std::vector<Samples>& t) {
    // Rank 0's view; both ranks finish each collective within one hop.
    const double bulk_min = Min(t[0].bulk_ms), bulk_med = Median(t[0].bulk_ms);
    auto gbps = [](double ms) { return (16.0 * (1 << 20)) / (ms * 1e-3) / 1e9; };
    std::printf(
        "[tcp-vs-gloo] %-7s W=2 16 MiB fp32 all-reduce: min %.2f ms (algBw %.2f GB/s), "
        "median %.2f ms (algBw %.2f GB/s); 8 B all-reduce: min %.1f us, median %.1f us\n",
        name, bulk_min, gbps(bulk_min), bulk_med, gbps(bulk_med), Min(t[0].latency_us),
        Median(t[0].latency_us));
  };
  report("TcpMesh", tcp_t);
  report("Gloo", gloo_t);
}

}  // namespace
}  // namespace tpudist::collectives::tcp
