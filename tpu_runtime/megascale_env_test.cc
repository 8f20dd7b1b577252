// Multi-slice discovery: the MEGASCALE_* variables alone (ReadMegascaleEnv)
// and folded into a RankInfo (DiscoverRankInfo), in the forms the KubeRay TPU
// webhook, Ray Train and plain torchrun give. Expected values are written out
// by hand from those launchers' rules, not computed by the code under test.
#include "tpu_runtime/megascale_env.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tpu_runtime/env_discovery.h"

namespace tpudist::tpu_runtime {
namespace {

using ::testing::HasSubstr;

std::string ErrorOf(const EnvMap& env) {
  absl::StatusOr<RankInfo> info = DiscoverRankInfo(env);
  return info.ok() ? std::string("ok: ") + ToString(*info) : std::string(info.status().message());
}

TEST(ReadMegascaleEnvTest, NothingSetIsNoMultiSlice) {
  absl::StatusOr<std::optional<MegascaleEnv>> ms = ReadMegascaleEnv({{"RANK", "0"}});
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_FALSE(ms->has_value());
}

TEST(ReadMegascaleEnvTest, WebhookFormAddressWithoutPortTakesMegascalePort) {
  absl::StatusOr<std::optional<MegascaleEnv>> ms =
      ReadMegascaleEnv({{"MEGASCALE_NUM_SLICES", "2"},
                        {"MEGASCALE_SLICE_ID", "1"},
                        {"MEGASCALE_COORDINATOR_ADDRESS", "ray-tpu-0-0.rc-headless"},
                        {"MEGASCALE_PORT", "8081"}});
  ASSERT_TRUE(ms.ok()) << ms.status();
  ASSERT_TRUE(ms->has_value());
  EXPECT_EQ((*ms)->num_slices, 2);
  EXPECT_EQ((*ms)->slice_index, 1);
  EXPECT_EQ((*ms)->coordinator, "ray-tpu-0-0.rc-headless:8081");
  EXPECT_EQ((*ms)->coordinator_host, "ray-tpu-0-0.rc-headless");
}

TEST(ReadMegascaleEnvTest, RayFormAddressCarriesThePortAndMegascalePortIsPerWorker) {
  // Ray Train sets MEGASCALE_PORT = base + LOCAL_RANK; the address keeps the base.
  absl::StatusOr<std::optional<MegascaleEnv>> ms =
      ReadMegascaleEnv({{"MEGASCALE_NUM_SLICES", "3"},
                        {"MEGASCALE_SLICE_ID", "2"},
                        {"MEGASCALE_COORDINATOR_ADDRESS", "10.0.0.7:8081"},
                        {"MEGASCALE_PORT", "8084"}});
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_EQ((*ms)->coordinator, "10.0.0.7:8081");
  EXPECT_EQ((*ms)->coordinator_host, "10.0.0.7");
}

TEST(ReadMegascaleEnvTest, EveryInconsistencyNamesItsVariable) {
  const EnvMap base{{"MEGASCALE_NUM_SLICES", "2"},
                    {"MEGASCALE_SLICE_ID", "0"},
                    {"MEGASCALE_COORDINATOR_ADDRESS", "coord"}};
  struct Case {
    std::string drop, set, value, want;
  };
  const std::vector<Case> cases = {
      {"", "MEGASCALE_SLICE_ID", "2", "MEGASCALE_SLICE_ID=\"2\": expected 0..1"},
      {"", "MEGASCALE_SLICE_ID", "-1", "MEGASCALE_SLICE_ID"},
      {"", "MEGASCALE_NUM_SLICES", "0", "MEGASCALE_NUM_SLICES"},
      {"", "MEGASCALE_NUM_SLICES", "two", "MEGASCALE_NUM_SLICES"},
      {"MEGASCALE_NUM_SLICES", "", "", "MEGASCALE_NUM_SLICES is unset"},
      {"MEGASCALE_SLICE_ID", "", "", "MEGASCALE_SLICE_ID is unset"},
      {"MEGASCALE_COORDINATOR_ADDRESS", "", "", "MEGASCALE_COORDINATOR_ADDRESS is unset"},
      {"", "MEGASCALE_PORT", "70000", "MEGASCALE_PORT"},
      {"", "MEGASCALE_COORDINATOR_ADDRESS", "coord:http", "MEGASCALE_COORDINATOR_ADDRESS"},
      {"", "MEGASCALE_COORDINATOR_ADDRESS", "a,b", "MEGASCALE_COORDINATOR_ADDRESS"},
  };
  for (const Case& c : cases) {
    EnvMap env = base;
    if (!c.drop.empty()) env.erase(c.drop);
    if (!c.set.empty()) env[c.set] = c.value;
    absl::StatusOr<std::optional<MegascaleEnv>> ms = ReadMegascaleEnv(env);
    ASSERT_FALSE(ms.ok()) << c.set << "=" << c.value << " drop " << c.drop;
    EXPECT_THAT(std::string(ms.status().message()), HasSubstr(c.want));
  }
  // One slice needs neither an id nor a coordinator.
  absl::StatusOr<std::optional<MegascaleEnv>> one = ReadMegascaleEnv({{"MEGASCALE_NUM_SLICES", "1"}});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)->slice_index, 0);
  EXPECT_EQ((*one)->coordinator, "");
}

// Slice `s` of two v6e 4x4 slices, as the KubeRay webhook fills a worker group
// with replicas: 2 (TPU_WORKER_* per replica, MEGASCALE_* from the pod spec).
EnvMap KubeRaySliceEnv(int s, int worker, int chip) {
  std::vector<std::string> hosts;
  for (int h = 0; h < 4; ++h) hosts.push_back(absl::StrCat("tpu-", s, "-", h, ".rc-headless"));
  return {{"TPU_WORKER_ID", absl::StrCat(worker)},
          {"TPU_WORKER_HOSTNAMES", absl::StrJoin(hosts, ",")},
          {"TPU_NAME", absl::StrCat("tpu-", s)},
          {"TPU_ACCELERATOR_TYPE", "v6e-16"},
          {"TPU_TOPOLOGY", "4x4"},
          {"TPU_VISIBLE_CHIPS", absl::StrCat(chip)},
          {"MEGASCALE_NUM_SLICES", "2"},
          {"MEGASCALE_SLICE_ID", absl::StrCat(s)},
          {"MEGASCALE_COORDINATOR_ADDRESS", "tpu-0-0.rc-headless"},
          {"MEGASCALE_PORT", "8081"}};
}

TEST(MultiSliceDiscoveryTest, KubeRayTwoV6eSlicesAreNumberedSliceMajor) {
  absl::StatusOr<RankInfo> info = DiscoverRankInfo(KubeRaySliceEnv(1, 2, 3));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rank, 27);  // 16 devices of slice 0 + host 2 x 4 + chip 3
  EXPECT_EQ(info->world_size, 32);
  EXPECT_EQ(info->local_rank, 3);
  EXPECT_EQ(info->local_world_size, 4);
  EXPECT_EQ(info->host_index, 6);  // 4 hosts of slice 0 + worker 2
  EXPECT_EQ(info->num_hosts, 8);
  EXPECT_EQ(info->slice_index, 1);
  EXPECT_EQ(info->num_slices, 2);
  EXPECT_EQ(info->devices_per_slice(), 16);
  EXPECT_EQ(info->rank_in_slice(), 11);
  EXPECT_EQ(info->host_in_slice(), 2);
  EXPECT_EQ(info->hostname(), "tpu-1-2.rc-headless");
  EXPECT_EQ(info->slicebuilder_address(), "tpu-1-2.rc-headless:8474");
  EXPECT_EQ(info->megascale_coordinator, "tpu-0-0.rc-headless:8081");
  // Rendezvous is slice 0's first host, never this slice's.
  EXPECT_EQ(info->master_addr, "tpu-0-0.rc-headless");
  EXPECT_EQ(info->slice.num_hosts, 4);
  EXPECT_EQ(info->slice.slice_name, "tpu-1");
  EXPECT_THAT(ToString(*info), HasSubstr("rank 27/32 local 3/4 host 6/8 slice 1/2"));
  // Every rank of both slices lands on a distinct global rank.
  std::vector<int> seen(32, 0);
  for (int s = 0; s < 2; ++s) {
    for (int w = 0; w < 4; ++w) {
      for (int c = 0; c < 4; ++c) {
        absl::StatusOr<RankInfo> r = DiscoverRankInfo(KubeRaySliceEnv(s, w, c));
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_EQ(r->rank, s * 16 + w * 4 + c);
        ++seen[r->rank];
      }
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 32);
}

TEST(MultiSliceDiscoveryTest, RayTrainRanksOnTpuHostsAreCheckedAgainstTheSlice) {
  // Ray Train: RANK / WORLD_SIZE / LOCAL_* from the trainer, TPU_* from the
  // host, MEGASCALE_* from _setup_tpu_multislice (slice id = rank // 16).
  EnvMap env = KubeRaySliceEnv(1, 2, 3);
  env.erase("TPU_VISIBLE_CHIPS");
  env.insert({{"RANK", "27"}, {"WORLD_SIZE", "32"}, {"LOCAL_RANK", "3"},
              {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "29500"}});
  env["MEGASCALE_COORDINATOR_ADDRESS"] = "10.0.0.7:8081";
  env["MEGASCALE_PORT"] = "8084";
  absl::StatusOr<RankInfo> info = DiscoverRankInfo(env);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rank, 27);
  EXPECT_EQ(info->host_index, 6);
  EXPECT_EQ(info->num_hosts, 8);
  EXPECT_EQ(info->master_addr, "10.0.0.7");
  EXPECT_EQ(info->megascale_coordinator, "10.0.0.7:8081");

  // A restarted job whose launcher still announces 3 slices for 32 devices.
  EnvMap stale = env;
  stale["MEGASCALE_NUM_SLICES"] = "3";
  EXPECT_THAT(ErrorOf(stale),
              HasSubstr("WORLD_SIZE=\"32\": expected 48, the devices of 3 slices x the TPU slice"));
  EnvMap wrong_slice = env;
  wrong_slice["MEGASCALE_SLICE_ID"] = "0";
  EXPECT_THAT(ErrorOf(wrong_slice),
              HasSubstr("MEGASCALE_SLICE_ID=\"0\": expected 1 = RANK=27 / 16 devices per slice"));
  EnvMap wrong_worker = env;
  wrong_worker["TPU_WORKER_ID"] = "1";
  EXPECT_THAT(ErrorOf(wrong_worker),
              HasSubstr("TPU_WORKER_ID=\"1\": expected 2 = RANK=27 / 4 devices per host % 4 "
                        "hosts per slice"));
}

TEST(MultiSliceDiscoveryTest, TorchrunRanksSplitIntoEqualSlicesOfWholeHosts) {
  const EnvMap env{{"RANK", "5"},          {"WORLD_SIZE", "8"},
                   {"LOCAL_RANK", "1"},    {"LOCAL_WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "m"},   {"MEGASCALE_NUM_SLICES", "2"},
                   {"MEGASCALE_SLICE_ID", "1"}, {"MEGASCALE_COORDINATOR_ADDRESS", "m:8081"}};
  absl::StatusOr<RankInfo> info = DiscoverRankInfo(env);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->host_index, 2);
  EXPECT_EQ(info->num_hosts, 4);
  EXPECT_EQ(info->slice_index, 1);
  EXPECT_EQ(info->rank_in_slice(), 1);
  EXPECT_EQ(info->host_in_slice(), 0);

  EnvMap e = env;
  e["MEGASCALE_SLICE_ID"] = "0";
  EXPECT_THAT(ErrorOf(e), HasSubstr("MEGASCALE_SLICE_ID=\"0\": expected 1 = RANK=5 / 4 devices"));
  e = env;
  e["MEGASCALE_NUM_SLICES"] = "3";
  e["MEGASCALE_SLICE_ID"] = "2";
  EXPECT_THAT(ErrorOf(e), HasSubstr("WORLD_SIZE=\"8\": expected a multiple of MEGASCALE_NUM_SLICES=3"));
  e = env;
  e["MEGASCALE_NUM_SLICES"] = "8";
  e["MEGASCALE_SLICE_ID"] = "5";
  EXPECT_THAT(ErrorOf(e), HasSubstr("expected whole hosts per slice"));
}

TEST(MultiSliceDiscoveryTest, OneSliceIsUnchanged) {
  EnvMap env = KubeRaySliceEnv(0, 1, 2);
  for (const char* v : {"MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID",
                        "MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_PORT"}) {
    env.erase(v);
  }
  absl::StatusOr<RankInfo> plain = DiscoverRankInfo(env);
  ASSERT_TRUE(plain.ok()) << plain.status();
  env["MEGASCALE_NUM_SLICES"] = "1";
  absl::StatusOr<RankInfo> one = DiscoverRankInfo(env);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*plain, *one);
  EXPECT_EQ(one->rank, 6);
  EXPECT_EQ(one->master_addr, "tpu-0-0.rc-headless");
  EXPECT_THAT(ToString(*one), ::testing::Not(HasSubstr("slice")));
}

}  // namespace
}  // namespace tpudist::tpu_runtime
