#include "tpu_runtime/env_discovery.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tpu_runtime/slice_env.h"

namespace tpudist::tpu_runtime {
namespace {

using ::testing::ElementsAre;

// The two seed slices written out by hand (the oracle; not computed by the
// code under test).
SliceSpec V6e4x4(const std::string& name) {
  SliceSpec s;
  s.accelerator_type = "v6e";
  s.chip_topology = {4, 4};
  s.chiplets_per_chip = 1;
  s.process_topology = {4, 4, 1};
  s.num_hosts = 4;
  s.devices_per_host = 4;
  s.slice_name = name;
  return s;
}

SliceSpec Tpu7x2x2x2(const std::string& name) {
  SliceSpec s;
  s.accelerator_type = "tpu7x";
  s.chip_topology = {2, 2, 2};
  s.chiplets_per_chip = 2;
  s.process_topology = {2, 2, 2, 2};
  s.num_hosts = 2;
  s.devices_per_host = 8;
  s.slice_name = name;
  return s;
}

std::vector<std::string> KubeRayHosts(int n) {
  std::vector<std::string> hosts;
  for (int j = 0; j < n; ++j) hosts.push_back(absl::StrCat("ray-tpu-0-", j, ".rc-headless"));
  return hosts;
}

// What rank r of a slice laid out host-major must look like.
RankInfo Expected(const SliceSpec& spec, const std::vector<std::string>& hosts, int r) {
  RankInfo e;
  e.rank = r;
  e.world_size = spec.num_hosts * spec.devices_per_host;
  e.local_rank = r % spec.devices_per_host;
  e.local_world_size = spec.devices_per_host;
  e.host_index = r / spec.devices_per_host;
  e.num_hosts = spec.num_hosts;
  e.master_addr = hosts[0];
  e.master_port = 29500;
  e.hostnames = hosts;
  for (const std::string& h : hosts) {
    for (int l = 0; l < spec.devices_per_host; ++l) {
      e.slicebuilder_addresses.push_back(absl::StrCat(h, ":", 8471 + l));
    }
  }
  e.slice = spec;
  e.source = DiscoverySource::kKubeRayTpu;
  e.job_id = absl::StrCat(hosts[0], ":29500");
  return e;
}

TEST(DiscoverTest, KubeRayV6eEveryRankFromWorkerIdAndLocalRank) {
  const std::vector<std::string> hosts = KubeRayHosts(4);
  for (int r = 0; r < 16; ++r) {
    EnvMap env{{"TPU_WORKER_ID", absl::StrCat(r / 4)},
               {"TPU_WORKER_HOSTNAMES", absl::StrJoin(hosts, ",")},
               {"TPU_NAME", "ray-tpu-0"},
               {"TPU_ACCELERATOR_TYPE", "v6e-16"},
               {"TPU_TOPOLOGY", "4x4"},
               {"LOCAL_RANK", absl::StrCat(r % 4)}};
    absl::StatusOr<RankInfo> info = DiscoverRankInfo(env);
    ASSERT_TRUE(info.ok()) << r << ": " << info.status();
    EXPECT_EQ(*info, Expected(V6e4x4("ray-tpu-0"), hosts, r)) << ToString(*info);
  }
}

TEST(DiscoverTest, KubeRayTpu7xEveryRankFromWorkerIdAndVisibleChips) {
  const std::vector<std::string> hosts = KubeRayHosts(2);
  for (int r = 0; r < 16; ++r) {
    EnvMap env{{"TPU_WORKER_ID", absl::StrCat(r / 8)},
               {"TPU_WORKER_HOSTNAMES", absl::StrJoin(hosts, ",")},
               {"TPU_NAME", "ray-tpu-0"},
               {"TPU_ACCELERATOR_TYPE", "tpu7x-16"},
               {"TPU_TOPOLOGY", "2x2x2"},
               {"RAY_TPU_RESOURCE_PER_CHIP", "2"},
               {"TPU_VISIBLE_CHIPS", absl::StrCat(r % 8)}};
    absl::StatusOr<RankInfo> info = DiscoverRankInfo(env);
    ASSERT_TRUE(info.ok()) << r << ": " << info.status();
    EXPECT_EQ(*info, Expected(Tpu7x2x2x2("ray-tpu-0"), hosts, r)) << ToString(*info);
    EXPECT_EQ(info->slicebuilder_address(), absl::StrCat(hosts[r / 8], ":", 8471 + r % 8));
  }
}

TEST(DiscoverTest, RoundTripsSliceEnvironmentForEveryRankOfBothSeeds) {
  for (const auto& [accel, topo] : {std::make_pair("v6e", "4x4"), std::make_pair("tpu7x", "2x2x2")}) {
    absl::StatusOr<SliceSpec> spec = SliceSpecFromFlags(accel, topo);
    ASSERT_TRUE(spec.ok()) << spec.status();
    SliceSpec named = *spec;
    named.slice_name = "tpu-slice-0";
    std::vector<std::string> hosts;
    for (int h = 0; h < spec->num_hosts; ++h) hosts.push_back(absl::StrCat("127.0.1.", h + 1));
    for (int r = 0; r < spec->num_devices(); ++r) {
      absl::StatusOr<EnvMap> env = SliceEnvironment(*spec, r, SliceEnvOptions());
      ASSERT_TRUE(env.ok()) << env.status();
      absl::StatusOr<RankInfo> info = DiscoverRankInfo(*env);
      ASSERT_TRUE(info.ok()) << accel << " rank " << r << ": " << info.status();
      EXPECT_EQ(*info, Expected(named, hosts, r)) << ToString(*info);
    }
  }
  EXPECT_EQ(V6e4x4("tpu-slice-0"), [] {
    SliceSpec s = *SliceSpecFromFlags("v6e", "4x4");
    s.slice_name = "tpu-slice-0";
    return s;
  }());
  EXPECT_EQ(Tpu7x2x2x2(""), *SliceSpecFromFlags("tpu7x", "2x2x2"));
}

TEST(DiscoverTest, RoundTripKeepsOptions) {
  SliceEnvOptions opts;
  opts.hostnames = KubeRayHosts(2);
  opts.master_addr = "coord.example";
  opts.master_port = 12345;
  opts.slicebuilder_base_port = 9000;
  opts.slice_name = "s1";
  opts.job_id = "job-42";
  opts.restart_count = 3;
  absl::StatusOr<EnvMap> env = SliceEnvironment(*SliceSpecFromFlags("tpu7x", "2x2x2"), 11, opts);
  ASSERT_TRUE(env.ok());
  absl::StatusOr<RankInfo> info = DiscoverRankInfo(*env);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rank, 11);
  EXPECT_EQ(info->host_index, 1);
  EXPECT_EQ(info->local_rank, 3);
  EXPECT_EQ(info->master_addr, "coord.example");
  EXPECT_EQ(info->master_port, 12345);
  EXPECT_EQ(info->slicebuilder_address(), "ray-tpu-0-1.rc-headless:9003");
  EXPECT_EQ(info->slice.slice_name, "s1");
  EXPECT_EQ(info->job_id, "job-42");
  EXPECT_EQ(info->restart_count, 3);
}

TEST(DiscoverTest, RayTrainOnTpuCrossChecksAndAgrees) {
  const std::vector<std::string> hosts = KubeRayHosts(4);
  EnvMap env{{"RANK", "9"},          {"WORLD_SIZE", "16"},
             {"LOCAL_RANK", "1"},    {"LOCAL_WORLD_SIZE", "4"},
             {"NODE_RANK", "2"},     {"TPU_WORKER_ID", "2"},
             {"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "40000"},
             {"TPU_WORKER_HOSTNAMES", absl::StrJoin(hosts, ",")},
             {"TPU_ACCELERATOR_TYPE", "TPU-V6E"}, {"TPU_TOPOLOGY", "4x4"}};
  absl::StatusOr<RankInfo> info = DiscoverRankInfo(env);
  ASSERT_TRUE(info.ok()) << info.status();
  RankInfo want = Expected(V6e4x4(""), hosts, 9);
  want.master_addr = "10.0.0.5";
  want.master_port = 40000;
  want.job_id = "10.0.0.5:40000";
  EXPECT_EQ(*info, want);
}

TEST(DiscoverTest, TorchTpuSingleHostWithoutGeneration) {
  EnvMap env{{"RANK", "2"}, {"LOCAL_RANK", "2"}, {"WORLD_SIZE", "4"},
             {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "29501"},
             {"TORCH_TPU_TOPOLOGY", "2,2,1"},
             {"TORCH_TPU_SLICEBUILDER_ADDRESSES",
              "localhost:9001,localhost:9002,localhost:9003,localhost:9004"}};
  absl::StatusOr<RankInfo> info = DiscoverRankInfo(env);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->source, DiscoverySource::kTorchTpu);
  EXPECT_EQ(info->slice.accelerator_type, "tpu");
  EXPECT_THAT(info->slice.chip_topology, ElementsAre(2, 2, 1));
  EXPECT_EQ(info->num_hosts, 1);
  EXPECT_EQ(info->local_world_size, 4);
  EXPECT_EQ(info->slicebuilder_address(), "localhost:9003");
  EXPECT_THAT(info->hostnames, ElementsAre("localhost"));
  // With the generation known, the chip topology drops the padding dim.
  env["TPU_ACCELERATOR_TYPE"] = "v6e";
  info = DiscoverRankInfo(env);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->slice.accelerator_type, "v6e");
  EXPECT_THAT(info->slice.chip_topology, ElementsAre(2, 2));
}

TEST(DiscoverTest, TorchTpuMultiHostFromProcessTopology) {
  // The TorchTPU GKE example: process units plus the generation and hosts.
  const std::vector<std::string> hosts = KubeRayHosts(2);
  EnvMap env{{"RANK", "13"}, {"WORLD_SIZE", "16"}, {"LOCAL_RANK", "5"},
             {"TORCH_TPU_TOPOLOGY", "2,2,2,2"}, {"TPU_ACCELERATOR_TYPE", "tpu7x"},
             {"TPU_WORKER_HOSTNAMES", absl::StrJoin(hosts, ",")}};
  absl::StatusOr<RankInfo> info = DiscoverRankInfo(env);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(*info, Expected(Tpu7x2x2x2(""), hosts, 13));

  // Generation unknown: the host count comes from the hostnames.
  env.erase("TPU_ACCELERATOR_TYPE");
  info = DiscoverRankInfo(env);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->slice.accelerator_type, "tpu");
  EXPECT_EQ(info->num_hosts, 2);
  EXPECT_EQ(info->local_world_size, 8);
  EXPECT_EQ(info->host_index, 1);
  EXPECT_EQ(info->slicebuilder_address(), absl::StrCat(hosts[1], ":8476"));

  // ... or from the hosts of the slicebuilder addresses.
  env.erase("TPU_WORKER_HOSTNAMES");
  std::vector<std::string> sb;
  for (int r = 0; r < 16; ++r) sb.push_back(absl::StrCat("10.0.0.", r / 8 + 1, ":", 7000 + r % 8));
  env["TORCH_TPU_SLICEBUILDER_ADDRESSES"] = absl::StrJoin(sb, ",");
  info = DiscoverRankInfo(env);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_THAT(info->hostnames, ElementsAre("10.0.0.1", "10.0.0.2"));
  EXPECT_EQ(info->master_addr, "10.0.0.1");
  EXPECT_EQ(info->slicebuilder_address(), "10.0.0.2:7005");

  // Three hosts cannot share 16 devices evenly.
  env.erase("TORCH_TPU_SLICEBUILDER_ADDRESSES");
  env["TPU_WORKER_HOSTNAMES"] = "a,b,c";
  EXPECT_EQ(DiscoverRankInfo(env).status().message(),
            "TORCH_TPU_TOPOLOGY=\"2,2,2,2\": expected a device count divisible by 3 hosts (from "
            "the TPU_WORKER_HOSTNAMES count)");
}

}  // namespace
}  // namespace tpudist::tpu_runtime
