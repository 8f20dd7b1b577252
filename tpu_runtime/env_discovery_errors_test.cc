// Every inconsistent or malformed environment DiscoverRankInfo rejects, with
// the message it must give (variable, value, what was expected).
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tpu_runtime/env_discovery.h"

namespace tpudist::tpu_runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string ErrorOf(const EnvMap& env) {
  absl::StatusOr<RankInfo> info = DiscoverRankInfo(env);
  if (info.ok()) return "OK " + ToString(*info);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(info.status().message());
}

// A valid KubeRay v6e 4x4 environment for rank 6 (host 1, local 2).
EnvMap V6eRank6() {
  return {{"TPU_WORKER_ID", "1"},
          {"TPU_WORKER_HOSTNAMES", "h0,h1,h2,h3"},
          {"TPU_ACCELERATOR_TYPE", "v6e-16"},
          {"TPU_TOPOLOGY", "4x4"},
          {"LOCAL_RANK", "2"}};
}

EnvMap With(EnvMap env, const std::string& k, const std::string& v) {
  env[k] = v;
  return env;
}

std::string Addresses(int n, int dup_at = -1) {
  std::vector<std::string> a;
  for (int i = 0; i < n; ++i) a.push_back(absl::StrCat("h", i / 4, ":", 8471 + (i == dup_at ? i - 1 : i) % 4));
  return absl::StrJoin(a, ",");
}

TEST(DiscoverErrorsTest, BaselineIsValid) {
  EXPECT_THAT(ErrorOf(V6eRank6()), StartsWith("OK rank 6/16 local 2/4 host 1/4"));
}

TEST(DiscoverErrorsTest, Tpu7xDefaultsToTwoChipletsAndRejectsThreeDimsOnV6e) {
  EnvMap env{{"TPU_WORKER_ID", "1"}, {"TPU_WORKER_HOSTNAMES", "h0,h1"},
             {"TPU_ACCELERATOR_TYPE", "tpu7x"}, {"TPU_TOPOLOGY", "2x2x2"}, {"LOCAL_RANK", "7"}};
  EXPECT_THAT(ErrorOf(env), StartsWith("OK rank 15/16 local 7/8 host 1/2 (tpu7x 2x2x2"));
  EXPECT_EQ(ErrorOf(With(env, "LOCAL_RANK", "8")),
            "LOCAL_RANK=\"8\": expected 0..7 (8 devices per host)");
  EXPECT_EQ(ErrorOf(With(V6eRank6(), "TPU_TOPOLOGY", "4x4x1")),
            "TPU_TOPOLOGY=\"4x4x1\": expected a 2-D topology for v6e");
}

TEST(DiscoverErrorsTest, LauncherNumbers) {
  EXPECT_EQ(ErrorOf({{"RANK", "16"}, {"WORLD_SIZE", "16"}}),
            "RANK=\"16\": expected 0..15 (WORLD_SIZE=16)");
  EXPECT_EQ(ErrorOf({{"RANK", "-1"}, {"WORLD_SIZE", "16"}}),
            "RANK=\"-1\": expected a non-negative integer");
  EXPECT_EQ(ErrorOf({{"RANK", "0"}, {"WORLD_SIZE", "abc"}}),
            "WORLD_SIZE=\"abc\": expected an integer in 1..1073741824");
  EXPECT_EQ(ErrorOf({{"RANK", "0"}, {"WORLD_SIZE", "0"}}),
            "WORLD_SIZE=\"0\": expected an integer in 1..1073741824");
  EXPECT_EQ(ErrorOf({{"RANK", "3"}}), "RANK=\"3\": expected WORLD_SIZE to be set too");
  EXPECT_EQ(ErrorOf({{"PMI_SIZE", "3"}}), "PMI_SIZE=\"3\": expected PMI_RANK to be set too");
  EXPECT_EQ(ErrorOf({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
            "MASTER_PORT=\"70000\": expected an integer in 1..65535");
  EXPECT_EQ(ErrorOf({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RESTART_COUNT", "-2"}}),
            "TORCHELASTIC_RESTART_COUNT=\"-2\": expected a non-negative integer");
}

TEST(DiscoverErrorsTest, LauncherLocalLayout) {
  EXPECT_EQ(ErrorOf({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "4"},
                     {"LOCAL_WORLD_SIZE", "4"}}),
            "LOCAL_RANK=\"4\": expected 0..3 (4 processes per host)");
  EXPECT_EQ(ErrorOf({{"RANK", "2"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                     {"LOCAL_WORLD_SIZE", "4"}}),
            "LOCAL_RANK=\"1\": expected 2, RANK=2 % 4 processes per host (ranks are laid out "
            "host by host)");
  EXPECT_EQ(ErrorOf({{"RANK", "2"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "3"}}),
            "LOCAL_WORLD_SIZE=\"3\": expected a divisor of WORLD_SIZE=8 (the same number of "
            "processes on every host)");
  EXPECT_EQ(ErrorOf({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"},
                     {"GROUP_RANK", "0"}}),
            "GROUP_RANK=\"0\": expected 1, RANK=5 / 4 processes per host");
  EXPECT_EQ(ErrorOf({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"GROUP_RANK", "1"}, {"NODE_RANK", "0"}}),
            "NODE_RANK=\"0\": expected 1, the same as GROUP_RANK");
  EXPECT_EQ(ErrorOf({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"},
                     {"GROUP_WORLD_SIZE", "4"}}),
            "GROUP_WORLD_SIZE=\"4\": expected 2, WORLD_SIZE=8 / 4 processes per host");
  EXPECT_EQ(ErrorOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "6"}, {"SLURM_NNODES", "4"}}),
            "SLURM_NTASKS=\"6\": expected a multiple of SLURM_NNODES=4 (tpu_dist needs the same "
            "number of tasks on every node)");
}

TEST(DiscoverErrorsTest, TpuTopologyVariables) {
  EXPECT_EQ(ErrorOf(With(V6eRank6(), "TPU_TOPOLOGY", "4x")),
            "TPU_TOPOLOGY=\"4x\": expected positive integers separated by 'x', like \"4x4\" or "
            "\"2x2x2\"");
  EnvMap no_type = V6eRank6();
  no_type.erase("TPU_ACCELERATOR_TYPE");
  EXPECT_THAT(ErrorOf(no_type), StartsWith("TPU_TOPOLOGY=\"4x4\": expected TPU_ACCELERATOR_TYPE"));
  EXPECT_THAT(ErrorOf(With(V6eRank6(), "TPU_ACCELERATOR_TYPE", "v3-8")),
              StartsWith("TPU_ACCELERATOR_TYPE=\"v3-8\": expected a TPU generation"));
  EXPECT_EQ(ErrorOf(With(V6eRank6(), "TORCH_TPU_TOPOLOGY", "4,4,2")),
            "TORCH_TPU_TOPOLOGY=\"4,4,2\": expected \"4,4,1\", the process units of "
            "TPU_TOPOLOGY=\"4x4\" on v6e with 1 device(s) per chip");
  EXPECT_THAT(ErrorOf(With(V6eRank6(), "RAY_TPU_RESOURCE_PER_CHIP", "2")),
              StartsWith("RAY_TPU_RESOURCE_PER_CHIP=\"2\": expected 1: only tpu7x"));
  EXPECT_EQ(ErrorOf({{"TPU_WORKER_ID", "0"}, {"LOCAL_RANK", "0"}}),
            "TPU_WORKER_ID=\"0\": expected a slice topology too: TPU_TOPOLOGY with "
            "TPU_ACCELERATOR_TYPE (GKE), or TORCH_TPU_TOPOLOGY");
  EXPECT_THAT(ErrorOf(With(V6eRank6(), "TPU_TOPOLOGY", "2x3")),
              HasSubstr("expected a multiple of 4"));
}

TEST(DiscoverErrorsTest, TpuHostsAndWorkerId) {
  EXPECT_EQ(ErrorOf(With(V6eRank6(), "TPU_WORKER_HOSTNAMES", "h0,h1,h2")),
            "TPU_WORKER_HOSTNAMES=\"h0,h1,h2\": expected 4 hostnames, one per host (16 chips of "
            "TPU_TOPOLOGY=\"4x4\" on v6e / 4 chips per host), got 3");
  EXPECT_EQ(ErrorOf(With(V6eRank6(), "TPU_WORKER_HOSTNAMES", "h0,h1,h0,h3")),
            "TPU_WORKER_HOSTNAMES=\"h0,h1,h0,h3\": expected distinct entries, but \"h0\" repeats");
  EXPECT_EQ(ErrorOf(With(V6eRank6(), "TPU_WORKER_ID", "4")),
            "TPU_WORKER_ID=\"4\": expected 0..3, one of the 4 hosts (16 chips of "
            "TPU_TOPOLOGY=\"4x4\" on v6e / 4 chips per host)");
  EXPECT_EQ(ErrorOf(With(V6eRank6(), "TPU_WORKER_ID", "one")),
            "TPU_WORKER_ID=\"one\": expected a non-negative integer");
  EnvMap no_id = V6eRank6();
  no_id.erase("TPU_WORKER_ID");
  EXPECT_EQ(ErrorOf(no_id),
            "TPU_WORKER_ID is unset: expected the host index 0..3 (or RANK) on a slice of 4 hosts");
  EnvMap no_hosts = V6eRank6();
  no_hosts.erase("TPU_WORKER_HOSTNAMES");
  EXPECT_EQ(ErrorOf(no_hosts),
            "TPU_WORKER_HOSTNAMES is unset: expected 4 hostnames for a multi-host slice (or "
            "TORCH_TPU_SLICEBUILDER_ADDRESSES)");
  EXPECT_EQ(ErrorOf(With(V6eRank6(), "TPU_DIST_HOST_ID", "h2")),
            "TPU_DIST_HOST_ID=\"h2\": expected \"h1\", the hostname of host 1");
}

TEST(DiscoverErrorsTest, TpuLocalRank) {
  EnvMap no_local = V6eRank6();
  no_local.erase("LOCAL_RANK");
  EXPECT_EQ(ErrorOf(no_local),
            "LOCAL_RANK is unset: expected LOCAL_RANK or TPU_VISIBLE_CHIPS to pick one of the 4 "
            "devices per host: TPU_WORKER_ID gives only the host");
  EXPECT_EQ(ErrorOf(With(V6eRank6(), "LOCAL_RANK", "4")),
            "LOCAL_RANK=\"4\": expected 0..3 (4 devices per host)");
  EXPECT_EQ(ErrorOf(With(V6eRank6(), "TPU_VISIBLE_CHIPS", "3")),
            "TPU_VISIBLE_CHIPS=\"3\": expected 2, this process's local rank (one device per "
            "process)");
  EXPECT_EQ(ErrorOf(With(V6eRank6(), "TPU_VISIBLE_CHIPS", "7")),
            "TPU_VISIBLE_CHIPS=\"7\": expected an integer in 0..3");
  // A list is Ray's mask, not a device: ignored.
  EXPECT_THAT(ErrorOf(With(V6eRank6(), "TPU_VISIBLE_CHIPS", "0,1,2,3")), StartsWith("OK rank 6/"));
  EXPECT_EQ(ErrorOf(With(V6eRank6(), "LOCAL_WORLD_SIZE", "8")),
            "LOCAL_WORLD_SIZE=\"8\": expected 4, the devices per host of the TPU slice (16 chips "
            "of TPU_TOPOLOGY=\"4x4\" on v6e / 4 chips per host)");
}

TEST(DiscoverErrorsTest, ExplicitRanksCrossCheckedAgainstTpu) {
  EnvMap env = V6eRank6();
  env["RANK"] = "6";
  env["WORLD_SIZE"] = "16";
  EXPECT_THAT(ErrorOf(env), StartsWith("OK rank 6/16"));
  EXPECT_EQ(ErrorOf(With(env, "WORLD_SIZE", "8")),
            "WORLD_SIZE=\"8\": expected 16, the devices of the TPU slice (16 chips of "
            "TPU_TOPOLOGY=\"4x4\" on v6e / 4 chips per host)");
  EXPECT_EQ(ErrorOf(With(env, "RANK", "10")),
            "TPU_WORKER_ID=\"1\": expected 2 = RANK=10 / 4 devices per host");
  EXPECT_EQ(ErrorOf(With(With(env, "RANK", "5"), "TPU_WORKER_ID", "1")),
            "LOCAL_RANK=\"2\": expected 1, RANK=5 % 4 devices per host");
  EXPECT_EQ(ErrorOf(With(env, "GROUP_WORLD_SIZE", "2")),
            "GROUP_WORLD_SIZE=\"2\": expected 4, the hosts of the TPU slice (16 chips of "
            "TPU_TOPOLOGY=\"4x4\" on v6e / 4 chips per host)");
  EXPECT_EQ(ErrorOf(With(env, "GROUP_RANK", "3")),
            "GROUP_RANK=\"3\": expected 1, RANK=6 / 4 devices per host");
}

TEST(DiscoverErrorsTest, Slicebuilder) {
  EXPECT_THAT(ErrorOf(With(V6eRank6(), "TORCH_TPU_SLICEBUILDER_ADDRESSES", Addresses(16))),
              StartsWith("OK rank 6/16"));
  EXPECT_THAT(ErrorOf(With(V6eRank6(), "TORCH_TPU_SLICEBUILDER_ADDRESSES", Addresses(16, 5))),
              HasSubstr("expected distinct entries, but \"h1:8471\" repeats"));
  const std::string fifteen = Addresses(15);
  EXPECT_EQ(ErrorOf(With(V6eRank6(), "TORCH_TPU_SLICEBUILDER_ADDRESSES", fifteen)),
            absl::StrCat("TORCH_TPU_SLICEBUILDER_ADDRESSES=\"", fifteen,
                         "\": expected 16 host:port entries, one per device (4 hosts x 4), got "
                         "15"));
  EXPECT_EQ(ErrorOf(With(V6eRank6(), "TORCH_TPU_SLICEBUILDER_ADDRESSES", "h0:8471,h0")),
            "TORCH_TPU_SLICEBUILDER_ADDRESSES=\"h0\": expected host:port, like \"10.0.0.2:8471\"");
}

}  // namespace
}  // namespace tpudist::tpu_runtime
