#include "tpu_runtime/launcher/launch_plan.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <tuple>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tpu_runtime/env_discovery.h"
#include "tpu_runtime/launcher/free_port.h"
#include "tpu_runtime/slice_env.h"

namespace tpudist::tpu_runtime::launcher {
namespace {

using ::testing::HasSubstr;

LaunchConfig SliceConfig(const char* accel, const char* topo, bool emulated) {
  LaunchConfig c;
  c.mode = LaunchConfig::Mode::kSlice;
  absl::StatusOr<SliceSpec> spec = SliceSpecFromFlags(accel, topo);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (spec.ok()) c.slice = *spec;
  c.hosts_emulated = emulated;
  c.command = {"./bin", "--flag"};
  c.job_id = "job42";
  return c;
}

// One tpurun per host: --max-restarts is refused (the hosts cannot agree on
// an attempt yet) and a follower-only failure points at the other hosts.
TEST(LaunchPlanTest, OneTpurunPerHostRefusesRestartsAndPointsAtOtherHosts) {
  LaunchConfig one_of_two = SliceConfig("v4", "2x2x2", /*emulated=*/false);
  one_of_two.host_index = 1;
  EXPECT_TRUE(IsOneOfManyHosts(one_of_two));
  EXPECT_TRUE(ValidateMaxRestarts(one_of_two, 0).ok());
  absl::Status refused = ValidateMaxRestarts(one_of_two, 2);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("--max-restarts=2 with one tpurun per host (host 1 of 2): not supported"));
  EXPECT_EQ(PeerFailureHint(one_of_two),
            "the rank that failed is on another host (this tpurun runs host 1 of 2, ranks 4-7): "
            "see the tpurun of host 0 (127.0.1.1)");

  LaunchConfig named = SliceConfig("v6e", "4x4", /*emulated=*/false);
  named.hostnames = {"h0", "h1", "h2", "h3"};
  EXPECT_THAT(PeerFailureHint(named), HasSubstr("see the tpurun of hosts 1 (h1), 2 (h2), 3 (h3)"));

  const LaunchConfig emulated = SliceConfig("v4", "2x2x2", /*emulated=*/true);
  EXPECT_FALSE(IsOneOfManyHosts(emulated));
  EXPECT_TRUE(ValidateMaxRestarts(emulated, 3).ok());
  EXPECT_EQ(PeerFailureHint(emulated), "");
  LaunchConfig plain;
  EXPECT_TRUE(ValidateMaxRestarts(plain, 1).ok());
  EXPECT_FALSE(ValidateMaxRestarts(plain, -1).ok());
}

TEST(LaunchPlanTest, PlainModeGivesTorchrunVariablesOnly) {
  LaunchConfig c;
  c.nproc = 4;
  c.command = {"./bin"};
  c.job_id = "j";
  absl::StatusOr<std::vector<ProcessSpec>> specs = PlanRanks(c, /*restart_count=*/2, 12345);
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 4u);
  const ProcessSpec& r3 = (*specs)[3];
  EXPECT_EQ(r3.rank, 3);
  EXPECT_EQ(r3.argv, std::vector<std::string>{"./bin"});
  EXPECT_EQ(r3.output_prefix, "[rank 3] ");
  EXPECT_EQ(r3.description, "rank 3 (host 0, local 3)");
  EXPECT_EQ(r3.env.at("RANK"), "3");
  EXPECT_EQ(r3.env.at("LOCAL_RANK"), "3");
  EXPECT_EQ(r3.env.at("WORLD_SIZE"), "4");
  EXPECT_EQ(r3.env.at("LOCAL_WORLD_SIZE"), "4");
  EXPECT_EQ(r3.env.at("GROUP_RANK"), "0");
  EXPECT_EQ(r3.env.at("MASTER_ADDR"), "127.0.0.1");
  EXPECT_EQ(r3.env.at("MASTER_PORT"), "12345");
  EXPECT_EQ(r3.env.at("TORCHELASTIC_RESTART_COUNT"), "2");
  EXPECT_EQ(r3.env.at("TORCHELASTIC_RUN_ID"), "j");
  EXPECT_EQ(r3.env.at("TPU_DIST_JOB_ID"), "j");
  EXPECT_EQ(r3.env.count("TPU_WORKER_ID"), 0u);
  EXPECT_EQ(r3.env.count("OMP_NUM_THREADS"), 0u);
}

TEST(LaunchPlanTest, EmulatedV6eGivesEveryRankItsHostsEnvironment) {
  LaunchConfig c = SliceConfig("TPU-V6E", "4x4", /*emulated=*/true);
  absl::StatusOr<std::vector<ProcessSpec>> specs = PlanRanks(c, 0, 20000);
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 16u);
  for (int r = 0; r < 16; ++r) {
    const ProcessSpec& s = (*specs)[r];
    EXPECT_EQ(s.rank, r);
    EXPECT_EQ(s.env.at("RANK"), absl::StrCat(r));
    EXPECT_EQ(s.env.at("TPU_WORKER_ID"), absl::StrCat(r / 4));
    EXPECT_EQ(s.env.at("LOCAL_RANK"), absl::StrCat(r % 4));
    EXPECT_EQ(s.env.at("TPU_DIST_HOST_ID"), absl::StrCat("127.0.1.", r / 4 + 1));
    EXPECT_EQ(s.env.at("MASTER_ADDR"), "127.0.1.1");
    EXPECT_EQ(s.env.at("MASTER_PORT"), "20000");
    EXPECT_EQ(s.env.at("TPU_DIST_JOB_ID"), "job42");
    EXPECT_EQ(s.env.at("ROLE_WORLD_SIZE"), "16");
  }
  EXPECT_EQ((*specs)[5].description, "rank 5 (host 1, local 1)");
  EXPECT_EQ((*specs)[5].output_prefix, "[rank  5] ");
  EXPECT_EQ((*specs)[5].argv, (std::vector<std::string>{"./bin", "--flag"}));
}

TEST(LaunchPlanTest, OneRealHostPlansOnlyItsRanks) {
  LaunchConfig c = SliceConfig("TPU-V6E", "4x4", /*emulated=*/false);
  c.host_index = 2;
  absl::StatusOr<std::vector<ProcessSpec>> specs = PlanRanks(c, 0, 29500);
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 4u);
  for (int l = 0; l < 4; ++l) {
    EXPECT_EQ((*specs)[l].rank, 8 + l);
    EXPECT_EQ((*specs)[l].env.at("TPU_WORKER_ID"), "2");
    EXPECT_EQ((*specs)[l].env.at("LOCAL_RANK"), absl::StrCat(l));
    EXPECT_EQ((*specs)[l].env.at("WORLD_SIZE"), "16");
  }
  EXPECT_FALSE(MayPickMasterPort(c));
  EXPECT_TRUE(MayPickMasterPort(SliceConfig("TPU-V6E", "4x4", true)));
}

TEST(LaunchPlanTest, Tpu7xIsTwoHostsOfEight) {
  LaunchConfig c = SliceConfig("tpu7x", "2x2x2", /*emulated=*/true);
  absl::StatusOr<std::vector<ProcessSpec>> specs = PlanRanks(c, 0, 20000);
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 16u);
  EXPECT_EQ((*specs)[9].env.at("TPU_WORKER_ID"), "1");
  EXPECT_EQ((*specs)[9].env.at("LOCAL_RANK"), "1");
  EXPECT_EQ((*specs)[9].env.at("LOCAL_WORLD_SIZE"), "8");
  EXPECT_EQ((*specs)[9].description, "rank 9 (host 1, local 1)");
  EXPECT_EQ(StartBanner(c), "tpu7x 2x2x2, 16 devices on 2 hosts x 8 (emulated), job job42");
}

TEST(LaunchPlanTest, Banners) {
  EXPECT_EQ(StartBanner(SliceConfig("TPU-V6E", "4x4", true)),
            "v6e 4x4, 16 devices on 4 hosts x 4 (emulated), job job42");
  LaunchConfig one_host = SliceConfig("TPU-V6E", "4x4", false);
  one_host.host_index = 1;
  EXPECT_EQ(StartBanner(one_host), "v6e 4x4, 16 devices on 4 hosts x 4 (host 1 of 4), job job42");
  LaunchConfig plain;
  plain.nproc = 3;
  plain.job_id = "p";
  EXPECT_EQ(StartBanner(plain), "3 processes (plain), job p");
}

TEST(LaunchPlanTest, ValidationNamesTheProblem) {
  LaunchConfig no_command = SliceConfig("TPU-V6E", "4x4", true);
  no_command.command.clear();
  EXPECT_THAT(std::string(ValidateLaunchConfig(no_command).message()), HasSubstr("no command"));
  LaunchConfig bad_host = SliceConfig("TPU-V6E", "4x4", false);
  bad_host.host_index = 4;
  EXPECT_THAT(std::string(ValidateLaunchConfig(bad_host).message()), HasSubstr("host_index=4"));
  LaunchConfig bad_hosts = SliceConfig("TPU-V6E", "4x4", true);
  bad_hosts.hostnames = {"a", "b"};
  EXPECT_THAT(std::string(ValidateLaunchConfig(bad_hosts).message()),
              HasSubstr("expected one per host, 4"));
  EXPECT_FALSE(PlanRanks(bad_hosts, 0, 1).ok());
  LaunchConfig plain;
  plain.nproc = 0;
  plain.command = {"x"};
  plain.job_id = "j";
  EXPECT_THAT(std::string(ValidateLaunchConfig(plain).message()), HasSubstr("nproc=0"));
  plain.nproc = 100000;  // a typo must not fork until the machine gives out
  EXPECT_EQ(ValidateLaunchConfig(plain).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ValidateLaunchConfig(plain).message()),
              HasSubstr("nproc=100000; expected 1 <= nproc <= 4096"));
  plain.nproc = kMaxLocalRanks;
  EXPECT_TRUE(ValidateLaunchConfig(plain).ok());
}

// Oracle: DiscoverRankInfo, what every rank runs on the env we give it.
void ExpectDiscoveryReproducesPlan(const LaunchConfig& c, int world, int per_host) {
  absl::StatusOr<std::vector<ProcessSpec>> specs = PlanRanks(c, /*restart_count=*/1, 23456);
  ASSERT_TRUE(specs.ok()) << specs.status();
  for (const ProcessSpec& spec : *specs) {
    EnvMap env = spec.env;
    env["TPU_DIST_RESTART_COUNT"] = "1";  // as the supervisor adds it
    absl::StatusOr<RankInfo> info = DiscoverRankInfo(env);
    ASSERT_TRUE(info.ok()) << spec.description << ": " << info.status();
    EXPECT_EQ(info->rank, spec.rank);
    EXPECT_EQ(info->world_size, world);
    EXPECT_EQ(info->local_rank, spec.rank % per_host);
    EXPECT_EQ(info->local_world_size, per_host);
    EXPECT_EQ(info->host_index, spec.rank / per_host);
    EXPECT_EQ(info->master_port, 23456);
    EXPECT_EQ(info->restart_count, 1);
    EXPECT_EQ(info->job_id, c.job_id);
  }
}

TEST(LaunchPlanTest, DiscoveryReproducesEveryPlannedRank) {
  ExpectDiscoveryReproducesPlan(SliceConfig("TPU-V6E", "4x4", true), 16, 4);
  ExpectDiscoveryReproducesPlan(SliceConfig("tpu7x", "2x2x2", true), 16, 8);
  LaunchConfig host1 = SliceConfig("TPU-V6E", "4x4", false);
  host1.host_index = 1;
  ExpectDiscoveryReproducesPlan(host1, 16, 4);
  LaunchConfig plain;
  plain.nproc = 3;
  plain.command = {"x"};
  plain.job_id = "plain-job";
  ExpectDiscoveryReproducesPlan(plain, 3, 3);
}

// Oracle: DiscoverRankInfo on every rank of 2 and 3 emulated slices gives the
// slice-major placement, the slice's own hostname and the coordinator.
TEST(LaunchPlanTest, DiscoveryReproducesEveryRankOfSeveralSlices) {
  for (const auto& [accel, topo, slices, per_slice, per_host] :
       std::vector<std::tuple<const char*, const char*, int, int, int>>{
           {"TPU-V6E", "2x2", 2, 4, 4}, {"v4", "2x2x2", 2, 8, 4}, {"tpu7x", "2x2x2", 3, 16, 8}}) {
    LaunchConfig c = SliceConfig(accel, topo, /*emulated=*/true);
    c.num_slices = slices;
    SCOPED_TRACE(StartBanner(c));
    ExpectDiscoveryReproducesPlan(c, slices * per_slice, per_host);
    absl::StatusOr<std::vector<ProcessSpec>> specs = PlanRanks(c, 1, 23456);
    ASSERT_TRUE(specs.ok()) << specs.status();
    for (const ProcessSpec& spec : *specs) {
      absl::StatusOr<RankInfo> info = DiscoverRankInfo(spec.env);
      ASSERT_TRUE(info.ok()) << spec.description << ": " << info.status();
      const int slice = spec.rank / per_slice;
      EXPECT_EQ(info->num_slices, slices);
      EXPECT_EQ(info->slice_index, slice);
      EXPECT_EQ(info->rank_in_slice(), spec.rank % per_slice);
      EXPECT_EQ(info->host_in_slice(), (spec.rank % per_slice) / per_host);
      EXPECT_EQ(info->num_hosts, slices * per_slice / per_host);
      EXPECT_EQ(info->hostname(),
                absl::StrCat("127.0.", slice + 1, ".", (spec.rank % per_slice) / per_host + 1));
      EXPECT_EQ(info->megascale_coordinator, "127.0.1.1:8081");
      EXPECT_EQ(info->master_addr, "127.0.1.1");
    }
  }
}

// Two emulated v6e 2x2 slices (one host of 4 each): 8 ranks, slice-major,
// each slice its own host and TPU_NAME, the webhook's MEGASCALE_* on every
// rank, torchrun's variables counting both slices.
TEST(LaunchPlanTest, TwoSlicesGiveEveryRankItsSlicesEnvironment) {
  LaunchConfig c = SliceConfig("TPU-V6E", "2x2", /*emulated=*/true);
  c.num_slices = 2;
  absl::StatusOr<std::vector<ProcessSpec>> specs = PlanRanks(c, 0, 20000);
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 8u);
  for (int r = 0; r < 8; ++r) {
    const ProcessSpec& s = (*specs)[r];
    const int slice = r / 4;
    SCOPED_TRACE(s.description);
    EXPECT_EQ(s.rank, r);
    EXPECT_EQ(s.env.at("RANK"), absl::StrCat(r));
    EXPECT_EQ(s.env.at("WORLD_SIZE"), "8");
    EXPECT_EQ(s.env.at("ROLE_WORLD_SIZE"), "8");
    EXPECT_EQ(s.env.at("LOCAL_RANK"), absl::StrCat(r % 4));
    EXPECT_EQ(s.env.at("LOCAL_WORLD_SIZE"), "4");
    EXPECT_EQ(s.env.at("TPU_WORKER_ID"), "0");  // host in its own slice
    EXPECT_EQ(s.env.at("TPU_WORKER_HOSTNAMES"), absl::StrCat("127.0.", slice + 1, ".1"));
    EXPECT_EQ(s.env.at("TPU_DIST_HOST_ID"), absl::StrCat("127.0.", slice + 1, ".1"));
    EXPECT_EQ(s.env.at("TPU_NAME"), absl::StrCat("tpu-slice-", slice));
    EXPECT_EQ(s.env.at("TPU_TOPOLOGY"), "2x2");
    EXPECT_EQ(s.env.at("GROUP_RANK"), absl::StrCat(slice));
    EXPECT_EQ(s.env.at("NODE_RANK"), absl::StrCat(slice));
    EXPECT_EQ(s.env.at("GROUP_WORLD_SIZE"), "2");
    EXPECT_EQ(s.env.at("MASTER_ADDR"), "127.0.1.1");
    EXPECT_EQ(s.env.at("MASTER_PORT"), "20000");
    EXPECT_EQ(s.env.at("MEGASCALE_NUM_SLICES"), "2");
    EXPECT_EQ(s.env.at("MEGASCALE_SLICE_ID"), absl::StrCat(slice));
    EXPECT_EQ(s.env.at("MEGASCALE_COORDINATOR_ADDRESS"), "127.0.1.1");
    EXPECT_EQ(s.env.at("MEGASCALE_PORT"), "8081");
    EXPECT_EQ(s.output_prefix, absl::StrCat("[rank ", r, "] "));
  }
  EXPECT_EQ((*specs)[6].description, "rank 6 (slice 1 host 0, local 2)");
  EXPECT_EQ(StartBanner(c), "v6e 2x2 x 2 slices, 8 devices on 2 hosts x 4 (emulated), job job42");
}

// Two v4 2x2x2 slices (2 hosts of 4 each): TPU_WORKER_ID / _HOSTNAMES are
// the slice's own; hosts and ranks run on slice-major.
TEST(LaunchPlanTest, TwoMultiHostSlicesNumberHostsSliceMajor) {
  LaunchConfig c = SliceConfig("v4", "2x2x2", /*emulated=*/true);
  c.num_slices = 2;
  c.megascale_port = 9000;
  absl::StatusOr<std::vector<ProcessSpec>> specs = PlanRanks(c, 0, 20000);
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 16u);
  const ProcessSpec& r13 = (*specs)[13];  // slice 1, host 1 of the slice, local 1
  EXPECT_EQ(r13.env.at("RANK"), "13");
  EXPECT_EQ(r13.env.at("WORLD_SIZE"), "16");
  EXPECT_EQ(r13.env.at("TPU_WORKER_ID"), "1");
  EXPECT_EQ(r13.env.at("TPU_WORKER_HOSTNAMES"), "127.0.2.1,127.0.2.2");
  EXPECT_EQ(r13.env.at("TPU_DIST_HOST_ID"), "127.0.2.2");
  EXPECT_EQ(r13.env.at("GROUP_RANK"), "3");
  EXPECT_EQ(r13.env.at("GROUP_WORLD_SIZE"), "4");
  EXPECT_EQ(r13.env.at("MEGASCALE_SLICE_ID"), "1");
  EXPECT_EQ(r13.env.at("MEGASCALE_PORT"), "9000");
  EXPECT_EQ(r13.env.at("TORCH_TPU_SLICEBUILDER_ADDRESSES"),
            "127.0.2.1:8471,127.0.2.1:8472,127.0.2.1:8473,127.0.2.1:8474,"
            "127.0.2.2:8471,127.0.2.2:8472,127.0.2.2:8473,127.0.2.2:8474");
  EXPECT_EQ((*specs)[5].env.at("TPU_WORKER_HOSTNAMES"), "127.0.1.1,127.0.1.2");
  EXPECT_EQ((*specs)[5].env.at("MEGASCALE_SLICE_ID"), "0");

  // Given hostnames: every slice's, slice-major.
  c.hostnames = {"a0", "a1", "b0", "b1"};
  specs = PlanRanks(c, 0, 20000);
  ASSERT_TRUE(specs.ok()) << specs.status();
  EXPECT_EQ((*specs)[13].env.at("TPU_WORKER_HOSTNAMES"), "b0,b1");
  EXPECT_EQ((*specs)[13].env.at("MEGASCALE_COORDINATOR_ADDRESS"), "a0");
  EXPECT_EQ((*specs)[13].env.at("MASTER_ADDR"), "a0");
  c.hostnames = {"a0", "a1"};
  EXPECT_THAT(std::string(ValidateLaunchConfig(c).message()),
              HasSubstr("expected one per host, 4 (2 slices x 2, slice-major)"));
}

TEST(LaunchPlanTest, OneSliceSetsNoMegascaleVariables) {
  LaunchConfig c = SliceConfig("TPU-V6E", "4x4", /*emulated=*/true);
  c.megascale_port = 9000;  // unused with one slice
  absl::StatusOr<std::vector<ProcessSpec>> specs = PlanRanks(c, 0, 20000);
  ASSERT_TRUE(specs.ok()) << specs.status();
  for (const ProcessSpec& s : *specs) {
    for (const auto& [name, value] : s.env) {
      EXPECT_EQ(name.rfind("MEGASCALE_", 0), std::string::npos) << name;
    }
    EXPECT_EQ(s.env.at("TPU_NAME"), "tpu-slice-0");
  }
}

TEST(LaunchPlanTest, SliceCountsTheEmulationCannotPlaceAreRefused) {
  LaunchConfig c = SliceConfig("TPU-V6E", "2x2", /*emulated=*/true);
  for (int bad : {0, -1, kMaxEmulatedSlices + 1}) {
    c.num_slices = bad;
    absl::Status s = ValidateLaunchConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("--num-slices=", bad, ": expected 1..254")));
    EXPECT_FALSE(PlanRanks(c, 0, 1).ok());
  }
  LaunchConfig big = SliceConfig("TPU-V6E", "16x16", /*emulated=*/true);  // 256 devices
  big.num_slices = 17;
  EXPECT_THAT(std::string(ValidateLaunchConfig(big).message()),
              HasSubstr("--num-slices=17 of 256 devices: 4352 ranks; expected at most 4096"));
  LaunchConfig real = SliceConfig("TPU-V6E", "4x4", /*emulated=*/false);
  real.num_slices = 2;
  EXPECT_THAT(std::string(ValidateLaunchConfig(real).message()),
              HasSubstr("--num-slices=2 without --hosts-emulated"));
}

TEST(FreePortTest, PortIsBindable) {
  absl::StatusOr<int> port = PickFreePort("127.0.0.1");
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_GT(*port, 0);
  EXPECT_LE(*port, 65535);
  // Oracle: the kernel lets us bind it right away.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(*port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);
  EXPECT_FALSE(PickFreePort("not-an-address").ok());
}

// The job secret reaches every rank as exactly one of the two variables.
TEST(LaunchPlanTest, JobSecretGoesToEveryRank) {
  LaunchConfig c = SliceConfig("v6e", "4x4", /*emulated=*/true);
  c.job_secret_hex = std::string(64, 'a');
  absl::StatusOr<std::vector<ProcessSpec>> specs = PlanRanks(c, 0, 29500);
  ASSERT_TRUE(specs.ok()) << specs.status();
  for (const ProcessSpec& spec : *specs) {
    EXPECT_EQ(spec.env.at("TPU_DIST_JOB_SECRET"), c.job_secret_hex) << spec.rank;
    EXPECT_EQ(spec.env.count("TPU_DIST_JOB_SECRET_FILE"), 0u);
  }
  c.job_secret_hex.clear();
  c.job_secret_file = "/run/secrets/job";
  specs = PlanRanks(c, 0, 29500);
  ASSERT_TRUE(specs.ok()) << specs.status();
  EXPECT_EQ((*specs)[5].env.at("TPU_DIST_JOB_SECRET_FILE"), "/run/secrets/job");
  EXPECT_EQ((*specs)[5].env.count("TPU_DIST_JOB_SECRET"), 0u);
  c.job_secret_hex = "ab";
  EXPECT_FALSE(ValidateLaunchConfig(c).ok());
}

// Losing a slice (issue 32 item 5): a slice is named only when every one
// of its ranks failed on its own; ranks, hosts and count come from the plan.
TEST(LaunchPlanTest, LostSliceLinesNameOnlySlicesWhoseRanksAllFailed) {
  LaunchConfig c = SliceConfig("v4", "2x2x2", /*emulated=*/true);  // 2 hosts x 4 per slice
  c.num_slices = 2;
  EXPECT_THAT(LostSliceLines(c, {8, 9, 10, 11, 12, 13, 14, 15}),
              ::testing::ElementsAre("slice 1 (ranks 8-15, hosts 127.0.2.1-127.0.2.2) lost: all 8 of "
                                     "its ranks failed before tpurun stopped the job"));
  EXPECT_TRUE(LostSliceLines(c, {8, 9, 10, 11, 12, 13, 14}).empty());  // rank 15 was stopped by tpurun
  EXPECT_TRUE(LostSliceLines(c, {3}).empty());
  EXPECT_EQ(LostSliceLines(c, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}).size(), 2u);
  LaunchConfig v6e = SliceConfig("TPU-V6E", "2x2", /*emulated=*/true);  // 1 host x 4 per slice
  v6e.num_slices = 3;
  EXPECT_THAT(LostSliceLines(v6e, {0, 4, 5, 6, 7}),
              ::testing::ElementsAre("slice 1 (ranks 4-7, host 127.0.2.1) lost: all 4 of its ranks "
                                     "failed before tpurun stopped the job"));
  LaunchConfig one = SliceConfig("TPU-V6E", "2x2", /*emulated=*/true);
  EXPECT_TRUE(LostSliceLines(one, {0, 1, 2, 3}).empty());  // one slice: the job itself is gone
}

// A restart plans every rank again: MEGASCALE_* and the torchrun variables
// come from the config and this attempt's master port, never from the
// first attempt's plan (the stale-slice-count hang of issue 32).
TEST(LaunchPlanTest, EveryAttemptRecomputesMegascaleAndTorchrunVariables) {
  LaunchConfig c = SliceConfig("TPU-V6E", "2x2", /*emulated=*/true);
  c.num_slices = 2;
  absl::StatusOr<std::vector<ProcessSpec>> first = PlanRanks(c, 0, 20000);
  absl::StatusOr<std::vector<ProcessSpec>> second = PlanRanks(c, 1, 20001);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_EQ(second->size(), 8u);
  for (int r = 0; r < 8; ++r) {
    const EnvMap& a = (*first)[r].env;
    const EnvMap& b = (*second)[r].env;
    SCOPED_TRACE(r);
    EXPECT_EQ(b.at("MEGASCALE_NUM_SLICES"), "2");
    EXPECT_EQ(b.at("MEGASCALE_SLICE_ID"), absl::StrCat(r / 4));
    EXPECT_EQ(b.at("MEGASCALE_COORDINATOR_ADDRESS"), "127.0.1.1");
    EXPECT_EQ(b.at("RANK"), absl::StrCat(r));
    EXPECT_EQ(b.at("WORLD_SIZE"), "8");
    EXPECT_EQ(b.at("MASTER_PORT"), "20001");
    EXPECT_EQ(a.at("MASTER_PORT"), "20000");
    for (const char* same : {"MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID", "MEGASCALE_COORDINATOR_ADDRESS",
                             "MEGASCALE_PORT", "RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE"}) {
      EXPECT_EQ(a.at(same), b.at(same)) << same;
    }
  }
}

}  // namespace
}  // namespace tpudist::tpu_runtime::launcher
