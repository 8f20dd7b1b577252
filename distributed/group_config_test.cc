// ResolveGroupConfig's rules, one environment variable at a time, and the
// precedence among explicit options, the environment and RankInfo.
#include "distributed/group_config.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"

namespace tpudist::distributed {
namespace {

using ::testing::HasSubstr;
namespace tr = ::tpudist::tpu_runtime;

tr::RankInfo Info(int rank = 1, int host_index = 2) {
  tr::RankInfo info;
  info.rank = rank;
  info.world_size = 16;
  info.host_index = host_index;
  info.num_hosts = 4;
  info.master_addr = "10.0.0.1";
  info.master_port = 1234;
  info.hostnames = {"10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4"};
  info.job_id = "job7";
  return info;
}

GroupConfig Resolve(const tr::RankInfo* info, const tr::EnvMap& env,
                    const GroupInitOptions& o = {}) {
  absl::StatusOr<GroupConfig> c = ResolveGroupConfig(info, env, o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : GroupConfig{};
}

std::string ErrorOf(const tr::RankInfo* info, const tr::EnvMap& env,
                    const GroupInitOptions& o = {}) {
  absl::StatusOr<GroupConfig> c = ResolveGroupConfig(info, env, o);
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  return std::string(c.status().message());
}

// inf became INT64_MAX ms and every collective "timed out" at once; 0 and
// negative timeouts expire at once. All refused, naming what is allowed.
TEST(GroupConfigTest, TimeoutMustBeFiniteAndPositive) {
  const tr::RankInfo info = Info();
  for (absl::Duration bad : {absl::InfiniteDuration(), absl::ZeroDuration(), absl::Seconds(-5),
                             absl::Hours(24 * 366)}) {
    GroupInitOptions o;
    o.timeout = bad;
    EXPECT_THAT(ErrorOf(&info, {}, o),
                HasSubstr(absl::StrCat("init_process_group timeout=", absl::FormatDuration(bad),
                                       ": expected a finite duration > 0")));
  }
}

TEST(GroupConfigTest, DefaultsWithoutEnvironment) {
  const tr::RankInfo info = Info();
  GroupInitOptions o;
  o.group_name = "trainer";
  o.timeout = absl::Seconds(42);
  const GroupConfig c = Resolve(&info, {}, o);
  EXPECT_EQ(c.backend, BackendKind::kTpuDist);
  EXPECT_EQ(c.group_name, "trainer");
  EXPECT_EQ(c.tpu_dist.group_name, "trainer");
  EXPECT_EQ(c.timeout, std::chrono::seconds(42));
  EXPECT_EQ(c.tpu_dist.timeout, std::chrono::seconds(42));
  EXPECT_EQ(c.tpu_dist.host_id, "slice_host_2");
  EXPECT_EQ(c.tpu_dist.job_id, "job7");
  EXPECT_EQ(c.tpu_dist.bind_address, "");
  EXPECT_EQ(c.tpu_dist.worker_hostname, "10.1.0.3");  // hostnames[host_index]
  EXPECT_EQ(c.tpu_dist.job_secret, "");
  EXPECT_EQ(c.gloo_hostname, "10.1.0.3");
  EXPECT_EQ(c.tcp_store.master_addr, "10.0.0.1");
  EXPECT_EQ(c.tcp_store.master_port, 1234);
  EXPECT_FALSE(c.tcp_store.is_server);  // rank 1
  EXPECT_EQ(c.tcp_store.world_size, 16);
}

TEST(GroupConfigTest, HostIdPrecedence) {
  const tr::RankInfo info = Info();
  const tr::EnvMap env = {{"TPU_DIST_HOST_ID", "127.0.1.3"}};
  EXPECT_EQ(Resolve(&info, env).tpu_dist.host_id, "127.0.1.3");  // env beats RankInfo
  GroupInitOptions o;
  o.host_id = "given";
  EXPECT_EQ(Resolve(&info, env, o).tpu_dist.host_id, "given");  // explicit beats env
  // Set but empty is unset (env_parse.h).
  EXPECT_EQ(Resolve(&info, {{"TPU_DIST_HOST_ID", ""}}).tpu_dist.host_id, "slice_host_2");
  // No RankInfo (test harnesses, a Python group made without info=): ""
  // (the process group's hostname/boot id).
  EXPECT_EQ(Resolve(nullptr, {}).tpu_dist.host_id, "");
  tr::RankInfo unknown = Info(1, -1);
  EXPECT_EQ(Resolve(&unknown, {}).tpu_dist.host_id, "");
}

// Placement is the RankInfo's host_index (and its host list), never the
// TPU_* variables again: a stale TPU_WORKER_ID / TPU_WORKER_HOSTNAMES (a
// process that re-exported them, a parent's copy) is not read, malformed or
// not. The old rule read them without a RankInfo: "slice_host_3" / "h1".
TEST(GroupConfigTest, PlacementFollowsTheRankInfoNotStaleTpuVariables) {
  const tr::EnvMap stale = {{"TPU_WORKER_ID", "3"}, {"TPU_WORKER_HOSTNAMES", "h0,h1,h2,h3"}};
  const tr::RankInfo info = Info(/*rank=*/5, /*host_index=*/1);
  GroupConfig c = Resolve(&info, stale);
  EXPECT_EQ(c.tpu_dist.host_id, "slice_host_1");
  EXPECT_EQ(c.tpu_dist.worker_hostname, "10.1.0.2");
  EXPECT_EQ(c.gloo_hostname, "10.1.0.2");
  // Without a RankInfo the variables name nothing (discovery is their reader).
  c = Resolve(nullptr, stale);
  EXPECT_EQ(c.tpu_dist.host_id, "");
  EXPECT_EQ(c.tpu_dist.worker_hostname, "");
  EXPECT_EQ(c.gloo_hostname, "127.0.0.1");
  EXPECT_EQ(Resolve(nullptr, {{"TPU_WORKER_ID", "two"}, {"TPU_WORKER_HOSTNAMES", "a,,b"}})
                .tpu_dist.host_id,
            "");
}

TEST(GroupConfigTest, JobIdPrecedence) {
  tr::RankInfo info = Info();
  EXPECT_EQ(Resolve(&info, {{"TPU_DIST_JOB_ID", "envjob"}}).tpu_dist.job_id, "envjob");
  GroupInitOptions o;
  o.job_id = "mine";
  EXPECT_EQ(Resolve(&info, {{"TPU_DIST_JOB_ID", "envjob"}}, o).tpu_dist.job_id, "mine");
  info.restart_count = 3;  // a restarted attempt gets its own segment names
  EXPECT_EQ(Resolve(&info, {}).tpu_dist.job_id, "job7_a3");
  EXPECT_EQ(Resolve(nullptr, {}).tpu_dist.job_id, "");
  EXPECT_EQ(Resolve(nullptr, {{"TPU_DIST_JOB_ID", "envjob"}}).tpu_dist.job_id, "envjob");
}

// Tests and experiments set the shm slots and take the paths meant for busy
// cores on idle ones.
TEST(GroupConfigTest, ShmTuningFromTheEnvironment) {
  GroupConfig c = Resolve(nullptr, {});
  EXPECT_FALSE(c.tpu_dist.shm_assume_foreign_load);
  EXPECT_EQ(c.tpu_dist.shm_slot_bytes, 0);
  EXPECT_EQ(c.tpu_dist.shm_num_slots, 0);
  // No variable: the backend's own default (its Options contract).
  EXPECT_EQ(c.tpu_dist.small_allreduce_bytes,
            ::tpudist::collectives::ProcessGroupTpuDist::Options{}.small_allreduce_bytes);
  EXPECT_TRUE(c.tpu_dist.shm_p2p);
  EXPECT_FALSE(Resolve(nullptr, {{"TPU_DIST_SHM_P2P", "0"}}).tpu_dist.shm_p2p);
  EXPECT_TRUE(Resolve(nullptr, {{"TPU_DIST_SHM_P2P", "1"}}).tpu_dist.shm_p2p);
  EXPECT_THAT(ErrorOf(nullptr, {{"TPU_DIST_SHM_P2P", "2"}}), HasSubstr("TPU_DIST_SHM_P2P"));
  c = Resolve(nullptr, {{"TPU_DIST_ASSUME_FOREIGN_LOAD", "1"},
                        {"TPU_DIST_SHM_SLOT_BYTES", "256"},
                        {"TPU_DIST_SHM_SLOTS", "8"},
                        {"TPU_DIST_SMALL_ALLREDUCE_BYTES", "0"}});
  EXPECT_TRUE(c.tpu_dist.shm_assume_foreign_load);
  EXPECT_EQ(c.tpu_dist.small_allreduce_bytes, 0);
  EXPECT_EQ(c.tpu_dist.shm_slot_bytes, 256);
  EXPECT_EQ(c.tpu_dist.shm_num_slots, 8);
  EXPECT_FALSE(Resolve(nullptr, {{"TPU_DIST_ASSUME_FOREIGN_LOAD", "0"}}).tpu_dist.shm_assume_foreign_load);
  EXPECT_THAT(ErrorOf(nullptr, {{"TPU_DIST_ASSUME_FOREIGN_LOAD", "yes"}}),
              HasSubstr("TPU_DIST_ASSUME_FOREIGN_LOAD=\"yes\""));
  EXPECT_THAT(ErrorOf(nullptr, {{"TPU_DIST_SHM_SLOTS", "-2"}}), HasSubstr("TPU_DIST_SHM_SLOTS"));
  EXPECT_THAT(ErrorOf(nullptr, {{"TPU_DIST_SHM_SLOT_BYTES", "1k"}}),
              HasSubstr("TPU_DIST_SHM_SLOT_BYTES=\"1k\""));
}

TEST(GroupConfigTest, BindAddressAndWorkerHostname) {
  const tr::RankInfo info = Info();
  const tr::EnvMap workers = {{"TPU_WORKER_HOSTNAMES", "h0, h1 ,h2"}, {"TPU_WORKER_ID", "1"}};
  // A RankInfo is the one source once it exists (discovery read the
  // variables already): TPU_WORKER_* are not read again.
  GroupConfig c = Resolve(&info, workers);
  EXPECT_EQ(c.tpu_dist.worker_hostname, "10.1.0.3");  // hostnames[host_index]
  EXPECT_EQ(c.gloo_hostname, "10.1.0.3");
  EXPECT_EQ(Resolve(&info, {{"TPU_WORKER_HOSTNAMES", "a,,b"}, {"TPU_WORKER_ID", "9"}})
                .tpu_dist.worker_hostname,
            "10.1.0.3");  // malformed, and not read
  // Without one (test harnesses) nothing names this host.
  c = Resolve(nullptr, workers);
  EXPECT_EQ(c.tpu_dist.worker_hostname, "");
  EXPECT_EQ(c.tpu_dist.bind_address, "");
  EXPECT_EQ(c.gloo_hostname, "127.0.0.1");
  tr::EnvMap env = workers;
  env["TPU_DIST_BIND_ADDRESS"] = "10.9.9.9";
  c = Resolve(&info, env);
  EXPECT_EQ(c.tpu_dist.bind_address, "10.9.9.9");
  EXPECT_EQ(c.gloo_hostname, "10.9.9.9");
  GroupInitOptions o;
  o.bind_address = "10.8.8.8";
  EXPECT_EQ(Resolve(&info, env, o).tpu_dist.bind_address, "10.8.8.8");
  env["TPU_DIST_BIND_ADDRESS"] = "0.0.0.0";  // a wildcard: Gloo still binds this host's entry
  c = Resolve(&info, env);
  EXPECT_EQ(c.tpu_dist.bind_address, "0.0.0.0");
  EXPECT_EQ(c.gloo_hostname, "10.1.0.3");
  EXPECT_EQ(Resolve(nullptr, {}).gloo_hostname, "127.0.0.1");
}

TEST(GroupConfigTest, JobSecretFromTheEnvironment) {
  const std::string hex(64, 'a');
  GroupConfig c = Resolve(nullptr, {{"TPU_DIST_JOB_SECRET", hex}});
  EXPECT_EQ(c.tpu_dist.job_secret, std::string(32, '\xaa'));
  EXPECT_THAT(ErrorOf(nullptr, {{"TPU_DIST_JOB_SECRET", "short"}}),
              HasSubstr("TPU_DIST_JOB_SECRET"));
  EXPECT_THAT(ErrorOf(nullptr, {{"TPU_DIST_JOB_SECRET", hex},
                                {"TPU_DIST_JOB_SECRET_FILE", "/nonexistent"}}),
              HasSubstr("TPU_DIST_JOB_SECRET_FILE"));
}

TEST(GroupConfigTest, StoreFromMasterAddrAndPort) {
  const tr::RankInfo info = Info(0);
  GroupConfig c = Resolve(&info, {{"MASTER_ADDR", "10.2.2.2"}, {"MASTER_PORT", "4321"}});
  EXPECT_EQ(c.tcp_store.master_addr, "10.2.2.2");
  EXPECT_EQ(c.tcp_store.master_port, 4321);
  EXPECT_TRUE(c.tcp_store.is_server);
  EXPECT_FALSE(c.given_store);
  EXPECT_THAT(ErrorOf(&info, {{"MASTER_PORT", "http"}}), HasSubstr("MASTER_PORT=\"http\""));
  EXPECT_THAT(ErrorOf(&info, {{"MASTER_PORT", "70000"}}), HasSubstr("1..65535"));
  // A given store wins; MASTER_PORT is then not needed (nor read).
  GroupInitOptions o;
  o.store = c10::make_intrusive<c10d::HashStore>();
  c = Resolve(&info, {{"MASTER_PORT", "http"}}, o);
  EXPECT_EQ(c.given_store, o.store);
}

TEST(GroupConfigTest, BackendAndGroupName) {
  GroupInitOptions o;
  o.backend = "gloo";
  o.gloo_threads = 1;
  GroupConfig c = Resolve(nullptr, {}, o);
  EXPECT_EQ(c.backend, BackendKind::kGloo);
  EXPECT_EQ(c.gloo_threads, 1);
  o.backend = "nccl";
  EXPECT_THAT(ErrorOf(nullptr, {}, o), HasSubstr("\"nccl\": expected tpu_dist or gloo"));
  o.backend = "tpu_dist";
  o.group_name = "";
  EXPECT_THAT(ErrorOf(nullptr, {}, o), HasSubstr("group_name"));
}

TEST(GroupNameForTest, RanksInTheNameOrAStableHash) {
  EXPECT_EQ(GroupNameFor("ffn_tp", std::vector<int>{0, 1, 2, 3}), "ffn_tp_0_1_2_3");
  EXPECT_EQ(GroupNameFor("dp", std::vector<int>{1, 3}), "dp_1_3");
  std::vector<int> big(64), strided(64);
  for (int i = 0; i < 64; ++i) {
    big[i] = i;
    strided[i] = 2 * i;
  }
  const std::string a = GroupNameFor("finetune", big);
  EXPECT_LE(a.size(), 64u);
  EXPECT_THAT(a, ::testing::StartsWith("finetune_n64_"));
  EXPECT_EQ(a, GroupNameFor("finetune", big));  // deterministic across calls/processes
  EXPECT_NE(a, GroupNameFor("finetune", strided));
}

}  // namespace
}  // namespace tpudist::distributed
