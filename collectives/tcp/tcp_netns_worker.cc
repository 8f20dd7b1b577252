// One emulated host of the multi-host test: joins a TcpMesh bound to this
// network namespace's address, runs a ring all-reduce (fp32 sum) and a ring
// all-gather across the hosts, checks both against the directly computed
// result, prints one line and exits 0 on success, 1 on any failure.
//
// Rank, world size and address come from tools/netns_hosts.sh run
// (TDH_RANK, TDH_SIZE, TDH_ADDR); the rest from flags:
//   --store=PATH   c10d::FileStore file shared by all hosts (required)
//   --group=KEY    mesh group key (default "netns")
//   --count=N      all-reduce elements and all-gather bytes per host
//                  (default 1000003)

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "collectives/tcp/ring_algorithms.h"
#include "collectives/tcp/tcp_mesh.h"
#include "tpu_runtime/job_secret.h"

namespace tpudist::collectives::tcp {
namespace {

float Input(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13) % 97) - 48);
}
uint8_t Byte(int rank, size_t i) { return static_cast<uint8_t>((i * 31 + rank * 101 + 7) & 0xff); }

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int Run(int argc, char** argv) {
  std::string store_path, group = "netns";
  size_t count = 1000003;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg(argv[i]);
    if (absl::ConsumePrefix(&arg, "--store=")) {
      store_path = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--group=")) {
      group = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--count=")) {
      if (!absl::SimpleAtoi(arg, &count)) return 2;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  int rank = -1, size = -1;
  const std::string addr = Env("TDH_ADDR");
  if (store_path.empty() || !absl::SimpleAtoi(Env("TDH_RANK"), &rank) ||
      !absl::SimpleAtoi(Env("TDH_SIZE"), &size) || addr.empty()) {
    std::fprintf(stderr, "need --store and TDH_RANK/TDH_SIZE/TDH_ADDR\n");
    return 2;
  }
  c10d::FileStore store(store_path, -1);
  TcpMeshOptions options;
  options.group_key = group;
  options.bind_address = addr;
  options.connect_timeout = absl::Seconds(30);
  // TPU_DIST_JOB_SECRET / _FILE, as the process group reads them.
  absl::StatusOr<std::string> secret = tpudist::tpu_runtime::JobSecretFromProcessEnv();
  if (!secret.ok()) {
    std::printf("host %d FAIL secret: %s\n", rank, std::string(secret.status().message()).c_str());
    return 2;
  }
  options.secret = *secret;
  auto mesh = TcpMesh::Connect(store, rank, size, options);
  if (!mesh.ok()) {
    std::printf("host %d FAIL connect: %s\n", rank, std::string(mesh.status().message()).c_str());
    return 1;
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::vector<float> data(count);  // [count]
  for (size_t i = 0; i < count; ++i) data[i] = Input(rank, i);
  absl::Time t0 = absl::Now();
  absl::Status s = RingAllReduce(
      **mesh, absl::MakeSpan(reinterpret_cast<uint8_t*>(data.data()), count * sizeof(float)),
      sizeof(float),
      [](void* inout, const void* in, size_t n) {
        for (size_t i = 0; i < n; ++i)
          static_cast<float*>(inout)[i] += static_cast<const float*>(in)[i];
      },
      deadline);
  absl::Duration ar_time = absl::Now() - t0;
  if (!s.ok()) {
    std::printf("host %d FAIL all-reduce: %s\n", rank, std::string(s.message()).c_str());
    return 1;
  }
  for (size_t i = 0; i < count; ++i) {
    float want = 0;
    for (int r = 0; r < size; ++r) want += Input(r, i);
    if (data[i] != want) {
      std::printf("host %d FAIL all-reduce value [%zu] = %f, want %f\n", rank, i, data[i], want);
      return 1;
    }
  }
  std::vector<uint8_t> gathered(count * size, 0xEE);  // [size, count]
  for (size_t i = 0; i < count; ++i) gathered[rank * count + i] = Byte(rank, i);
  t0 = absl::Now();
  s = RingAllGather(**mesh, absl::MakeSpan(gathered), deadline);
  absl::Duration ag_time = absl::Now() - t0;
  if (!s.ok()) {
    std::printf("host %d FAIL all-gather: %s\n", rank, std::string(s.message()).c_str());
    return 1;
  }
  for (int r = 0; r < size; ++r) {
    for (size_t i = 0; i < count; ++i) {
      if (gathered[r * count + i] != Byte(r, i)) {
        std::printf("host %d FAIL all-gather byte [%d][%zu]\n", rank, r, i);
        return 1;
      }
    }
  }
  std::printf(
      "host %d OK addr %s auth %s all-reduce %zu floats %.2f ms, all-gather %zu bytes %.2f ms\n",
      rank, addr.c_str(), options.secret.empty() ? "off" : "on", count,
      absl::ToDoubleMilliseconds(ar_time), count * size, absl::ToDoubleMilliseconds(ag_time));
  return 0;
}

}  // namespace
}  // namespace tpudist::collectives::tcp

int main(int argc, char** argv) { return tpudist::collectives::tcp::Run(argc, argv); }
