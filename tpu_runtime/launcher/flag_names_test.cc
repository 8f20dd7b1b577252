#include "tpu_runtime/launcher/flag_names.h"

#include "gtest/gtest.h"

namespace tpudist::tpu_runtime::launcher {
namespace {

TEST(FlagNamesTest, RewritesNamesOnlyUpToTheEndOfFlags) {
  const char* argv[] = {
      "./my-bin",   "--accelerator-type", "TPU-V6E", "--grace-period=5s", "-x-y", "--",
      "./rank-bin", "--die-rank",         "5"};
  std::vector<std::string> out = UnderscoreFlagNames(9, argv);
  EXPECT_EQ(out, (std::vector<std::string>{"./my-bin", "--accelerator_type", "TPU-V6E",
                                           "--grace_period=5s", "-x-y", "--", "./rank-bin",
                                           "--die-rank", "5"}));
}

TEST(FlagNamesTest, ValuesAfterEqualsKeepTheirDashes) {
  const char* argv[] = {"p", "--job-id=my-job-1", "--hosts-emulated"};
  EXPECT_EQ(UnderscoreFlagNames(3, argv),
            (std::vector<std::string>{"p", "--job_id=my-job-1", "--hosts_emulated"}));
  NormalizedArgv n(3, argv);
  EXPECT_EQ(n.argc(), 3);
  EXPECT_STREQ(n.argv()[1], "--job_id=my-job-1");
  EXPECT_EQ(n.argv()[3], nullptr);
}

}  // namespace
}  // namespace tpudist::tpu_runtime::launcher
