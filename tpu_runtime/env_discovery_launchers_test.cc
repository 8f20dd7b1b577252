// DiscoverRankInfo without TPU variables: torchrun, Ray Train, Open MPI,
// PMI, SLURM and nothing at all; plus EnvMapFromProcess.
#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tpu_runtime/env_discovery.h"

namespace tpudist::tpu_runtime {
namespace {

using ::testing::ElementsAre;

TEST(DiscoverTest, TorchrunAsPrintedByTorch113) {
  EnvMap env{{"RANK", "1"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"},
             {"GROUP_RANK", "0"}, {"GROUP_WORLD_SIZE", "1"}, {"ROLE_RANK", "1"},
             {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29655"},
             {"TORCHELASTIC_RESTART_COUNT", "0"}, {"TORCHELASTIC_RUN_ID", "none"}};
  absl::StatusOr<RankInfo> info = DiscoverRankInfo(env);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rank, 1);
  EXPECT_EQ(info->world_size, 2);
  EXPECT_EQ(info->local_rank, 1);
  EXPECT_EQ(info->local_world_size, 2);
  EXPECT_EQ(info->num_hosts, 1);
  EXPECT_EQ(info->source, DiscoverySource::kTorchrun);
  EXPECT_EQ(info->slice.accelerator_type, "cpu");
  EXPECT_THAT(info->hostnames, ElementsAre("127.0.0.1"));
  EXPECT_TRUE(info->slicebuilder_addresses.empty());
  EXPECT_EQ(info->job_id, "127.0.0.1:29655");
  env["TORCHELASTIC_RUN_ID"] = "abc123";
  env["TORCHELASTIC_RESTART_COUNT"] = "2";
  EXPECT_EQ(DiscoverRankInfo(env)->job_id, "abc123");
  EXPECT_EQ(DiscoverRankInfo(env)->restart_count, 2);
  env["TPU_DIST_JOB_ID"] = "mine";
  env["TPU_DIST_RESTART_COUNT"] = "5";
  EXPECT_EQ(DiscoverRankInfo(env)->job_id, "mine");
  EXPECT_EQ(DiscoverRankInfo(env)->restart_count, 5);
}

TEST(DiscoverTest, TorchrunTwoNodesDerivesHost) {
  EnvMap env{{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}};
  absl::StatusOr<RankInfo> info = DiscoverRankInfo(env);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->local_rank, 1);
  EXPECT_EQ(info->host_index, 1);
  EXPECT_EQ(info->num_hosts, 2);
  EXPECT_TRUE(info->hostnames.empty());
  EXPECT_EQ(info->slice.num_hosts, 2);
  EXPECT_EQ(info->slice.devices_per_host, 4);
  // Without any local size each process is its own host.
  info = DiscoverRankInfo({{"RANK", "5"}, {"WORLD_SIZE", "8"}});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->local_world_size, 1);
  EXPECT_EQ(info->host_index, 5);
  EXPECT_EQ(info->num_hosts, 8);
}

TEST(DiscoverTest, OpenMpiPmiAndSlurm) {
  absl::StatusOr<RankInfo> mpi = DiscoverRankInfo(
      {{"OMPI_COMM_WORLD_RANK", "6"}, {"OMPI_COMM_WORLD_SIZE", "8"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
       {"MASTER_ADDR", "n0"}});
  ASSERT_TRUE(mpi.ok()) << mpi.status();
  EXPECT_EQ(mpi->source, DiscoverySource::kMpi);
  EXPECT_EQ(mpi->rank, 6);
  EXPECT_EQ(mpi->host_index, 1);
  EXPECT_EQ(mpi->master_addr, "n0");

  absl::StatusOr<RankInfo> pmi = DiscoverRankInfo({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}});
  ASSERT_TRUE(pmi.ok()) << pmi.status();
  EXPECT_EQ(pmi->source, DiscoverySource::kMpi);
  EXPECT_EQ(pmi->rank, 3);
  EXPECT_EQ(pmi->world_size, 4);

  absl::StatusOr<RankInfo> slurm = DiscoverRankInfo(
      {{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
       {"SLURM_NODEID", "1"}, {"SLURM_NNODES", "2"}, {"SLURM_LAUNCH_NODE_IPADDR", "10.1.1.1"}});
  ASSERT_TRUE(slurm.ok()) << slurm.status();
  EXPECT_EQ(slurm->source, DiscoverySource::kSlurm);
  EXPECT_EQ(slurm->local_world_size, 4);
  EXPECT_EQ(slurm->local_rank, 1);
  EXPECT_EQ(slurm->host_index, 1);
  EXPECT_EQ(slurm->master_addr, "10.1.1.1");
  EXPECT_EQ(slurm->job_id, "10.1.1.1:29500");

  // torchrun beats MPI beats SLURM.
  absl::StatusOr<RankInfo> both = DiscoverRankInfo(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"},
       {"OMPI_COMM_WORLD_SIZE", "4"}, {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}});
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->source, DiscoverySource::kTorchrun);
  EXPECT_EQ(both->rank, 1);
}

TEST(DiscoverTest, NothingIsASingleProcess) {
  absl::StatusOr<RankInfo> info = DiscoverRankInfo({{"HOME", "/root"}, {"RANK", ""}});
  ASSERT_TRUE(info.ok()) << info.status();
  RankInfo want;
  want.hostnames = {"127.0.0.1"};
  want.slice.accelerator_type = "cpu";
  want.job_id = "127.0.0.1:29500";
  EXPECT_EQ(*info, want);
  EXPECT_EQ(info->source, DiscoverySource::kSingleProcess);
}

TEST(DiscoverTest, EnvMapFromProcessReadsEnviron) {
  ASSERT_EQ(setenv("TPU_DIST_DISCOVERY_TEST_VAR", "a=b", 1), 0);
  EnvMap env = EnvMapFromProcess();
  EXPECT_EQ(env["TPU_DIST_DISCOVERY_TEST_VAR"], "a=b");
  unsetenv("TPU_DIST_DISCOVERY_TEST_VAR");
  EXPECT_EQ(EnvMapFromProcess().count("TPU_DIST_DISCOVERY_TEST_VAR"), 0u);
}

}  // namespace
}  // namespace tpudist::tpu_runtime
