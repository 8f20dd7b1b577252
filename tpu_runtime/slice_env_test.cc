#include "tpu_runtime/slice_env.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::tpu_runtime {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Split(const std::string& s) { return absl::StrSplit(s, ','); }

TEST(SliceSpecFromFlagsTest, SeedSlices) {
  absl::StatusOr<SliceSpec> v6e = SliceSpecFromFlags("TPU-V6E", "4x4");
  ASSERT_TRUE(v6e.ok()) << v6e.status();
  EXPECT_EQ(v6e->accelerator_type, "v6e");
  EXPECT_THAT(v6e->chip_topology, ElementsAre(4, 4));
  EXPECT_EQ(v6e->chiplets_per_chip, 1);
  EXPECT_THAT(v6e->process_topology, ElementsAre(4, 4, 1));
  EXPECT_EQ(v6e->num_hosts, 4);
  EXPECT_EQ(v6e->devices_per_host, 4);

  absl::StatusOr<SliceSpec> x = SliceSpecFromFlags("tpu7x", "2x2x2");
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->accelerator_type, "tpu7x");
  EXPECT_THAT(x->chip_topology, ElementsAre(2, 2, 2));
  EXPECT_EQ(x->chiplets_per_chip, 2);
  EXPECT_THAT(x->process_topology, ElementsAre(2, 2, 2, 2));
  EXPECT_EQ(x->num_hosts, 2);
  EXPECT_EQ(x->devices_per_host, 8);
}

TEST(SliceSpecFromFlagsTest, ProcessUnitsGiveTheSameSpec) {
  EXPECT_EQ(*SliceSpecFromFlags("v6e", "4,4,1"), *SliceSpecFromFlags("v6e", "4x4"));
  EXPECT_EQ(*SliceSpecFromFlags("tpu7x-16", "2,2,2,2"), *SliceSpecFromFlags("tpu7x", "2x2x2"));
  absl::StatusOr<SliceSpec> bad = SliceSpecFromFlags("v6e", "4,4,1,2");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("topology=\"4,4,1,2\""));
}

TEST(SliceSpecFromFlagsTest, SmallSingleHostSlices) {
  absl::StatusOr<SliceSpec> s = SliceSpecFromFlags("v5litepod-8", "2x4");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->num_hosts, 1);
  EXPECT_EQ(s->devices_per_host, 8);
  s = SliceSpecFromFlags("tpu7x", "2x2x1");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->num_hosts, 1);
  EXPECT_EQ(s->devices_per_host, 8);
}

TEST(SliceSpecFromFlagsTest, ErrorsNameTheFlag) {
  absl::StatusOr<SliceSpec> s = SliceSpecFromFlags("v9z", "4x4");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("accelerator_type=\"v9z\""));
  s = SliceSpecFromFlags("v6e", "4x");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(),
            "topology=\"4x\": expected positive integers separated by 'x', like \"4x4\" or "
            "\"2x2x2\"");
}

TEST(SliceEnvironmentTest, V6eRank6MatchesWebhookGkeAndTorchTpu) {
  SliceEnvOptions opts;
  opts.job_id = "job7";
  opts.restart_count = 2;
  absl::StatusOr<EnvMap> env = SliceEnvironment(*SliceSpecFromFlags("v6e", "4x4"), 6, opts);
  ASSERT_TRUE(env.ok()) << env.status();
  EnvMap& e = *env;
  EXPECT_EQ(e["TPU_WORKER_ID"], "1");
  EXPECT_EQ(e["TPU_WORKER_HOSTNAMES"], "127.0.1.1,127.0.1.2,127.0.1.3,127.0.1.4");
  EXPECT_EQ(e["TPU_NAME"], "tpu-slice-0");
  EXPECT_EQ(e["TPU_ACCELERATOR_TYPE"], "v6e-16");
  EXPECT_EQ(e["TPU_TOPOLOGY"], "4x4");
  EXPECT_EQ(e["TORCH_TPU_TOPOLOGY"], "4,4,1");
  EXPECT_EQ(e.count("RAY_TPU_RESOURCE_PER_CHIP"), 0u);
  std::vector<std::string> sb = Split(e["TORCH_TPU_SLICEBUILDER_ADDRESSES"]);
  ASSERT_EQ(sb.size(), 16u);
  EXPECT_EQ(sb[0], "127.0.1.1:8471");
  EXPECT_EQ(sb[6], "127.0.1.2:8473");
  EXPECT_EQ(sb[15], "127.0.1.4:8474");
  EXPECT_EQ(e["MASTER_ADDR"], "127.0.1.1");
  EXPECT_EQ(e["MASTER_PORT"], "29500");
  EXPECT_EQ(e["RANK"], "6");
  EXPECT_EQ(e["WORLD_SIZE"], "16");
  EXPECT_EQ(e["LOCAL_RANK"], "2");
  EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(e["GROUP_RANK"], "1");
  EXPECT_EQ(e["NODE_RANK"], "1");
  EXPECT_EQ(e["TPU_VISIBLE_CHIPS"], "2");
  EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(e["TPU_DIST_JOB_ID"], "job7");
  EXPECT_EQ(e["TPU_DIST_HOST_ID"], "127.0.1.2");
}

TEST(SliceEnvironmentTest, Tpu7xEveryRank) {
  SliceEnvOptions opts;
  opts.hostnames = {"ray-tpu-0-0.c-headless", "ray-tpu-0-1.c-headless"};
  opts.slice_name = "ray-tpu-0";
  const SliceSpec spec = *SliceSpecFromFlags("tpu7x", "2x2x2");
  for (int r = 0; r < 16; ++r) {
    absl::StatusOr<EnvMap> env = SliceEnvironment(spec, r, opts);
    ASSERT_TRUE(env.ok()) << env.status();
    EnvMap& e = *env;
    EXPECT_EQ(e["TPU_WORKER_ID"], absl::StrCat(r / 8));
    EXPECT_EQ(e["LOCAL_RANK"], absl::StrCat(r % 8));
    EXPECT_EQ(e["RANK"], absl::StrCat(r));
    EXPECT_EQ(e["TPU_WORKER_HOSTNAMES"], "ray-tpu-0-0.c-headless,ray-tpu-0-1.c-headless");
    EXPECT_EQ(e["TPU_DIST_HOST_ID"], opts.hostnames[r / 8]);
    EXPECT_EQ(e["TPU_ACCELERATOR_TYPE"], "tpu7x-16");
    EXPECT_EQ(e["TPU_TOPOLOGY"], "2x2x2");
    EXPECT_EQ(e["TORCH_TPU_TOPOLOGY"], "2,2,2,2");
    EXPECT_EQ(e["RAY_TPU_RESOURCE_PER_CHIP"], "2");
    EXPECT_EQ(e["TPU_NAME"], "ray-tpu-0");
    EXPECT_EQ(e["MASTER_ADDR"], "ray-tpu-0-0.c-headless");
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "8");
    EXPECT_EQ(e["WORLD_SIZE"], "16");
    EXPECT_EQ(e.count("TPU_DIST_JOB_ID"), 0u);
    std::vector<std::string> sb = Split(e["TORCH_TPU_SLICEBUILDER_ADDRESSES"]);
    ASSERT_EQ(sb.size(), 16u);
    EXPECT_EQ(sb[r], absl::StrCat(opts.hostnames[r / 8], ":", 8471 + r % 8));
  }
}

TEST(SliceEnvironmentTest, RejectsBadInput) {
  const SliceSpec spec = *SliceSpecFromFlags("v6e", "4x4");
  SliceEnvOptions opts;
  EXPECT_THAT(SliceEnvironment(spec, 16, opts).status().message(), HasSubstr("rank=16"));
  EXPECT_THAT(SliceEnvironment(spec, -1, opts).status().message(), HasSubstr("rank=-1"));
  opts.hostnames = {"a", "b"};
  EXPECT_THAT(SliceEnvironment(spec, 0, opts).status().message(),
              HasSubstr("2 hostnames given; expected one per host, 4"));
  opts.hostnames = {"a", "b", "c:1", "d"};
  EXPECT_THAT(SliceEnvironment(spec, 0, opts).status().message(), HasSubstr("\"c:1\""));
  opts = SliceEnvOptions();
  opts.master_port = 70000;
  EXPECT_THAT(SliceEnvironment(spec, 0, opts).status().message(), HasSubstr("master_port=70000"));
  opts = SliceEnvOptions();
  opts.slicebuilder_base_port = 65534;
  EXPECT_THAT(SliceEnvironment(spec, 0, opts).status().message(),
              HasSubstr("slicebuilder_base_port=65534"));
  EXPECT_FALSE(SliceEnvironment(SliceSpec(), 0, SliceEnvOptions()).ok());
}

}  // namespace
}  // namespace tpudist::tpu_runtime
