#include "tpu_runtime/duration_check.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::tpu_runtime {
namespace {

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(DurationCheckTest, TimeoutsMustBeFinitePositiveAndBounded) {
  for (absl::Duration ok : {absl::Milliseconds(1), absl::Seconds(30), kMaxUserDuration}) {
    EXPECT_TRUE(CheckUserDuration("--timeout", ok, DurationRule::kPositive).ok()) << ok;
  }
  EXPECT_EQ(Message(CheckUserDuration("--timeout", absl::InfiniteDuration(),
                                      DurationRule::kPositive)),
            "--timeout=inf: expected a finite duration > 0 and at most 8760h (e.g. 30s, 5m, 2h)");
  EXPECT_EQ(Message(CheckUserDuration("--timeout", absl::ZeroDuration(), DurationRule::kPositive)),
            "--timeout=0: expected a finite duration > 0 and at most 8760h (e.g. 30s, 5m, 2h)");
  EXPECT_THAT(Message(CheckUserDuration("--timeout", absl::Seconds(-5), DurationRule::kPositive)),
              ::testing::StartsWith("--timeout=-5s: expected"));
  EXPECT_FALSE(CheckUserDuration("--timeout", -absl::InfiniteDuration(), DurationRule::kPositive)
                   .ok());
  EXPECT_FALSE(
      CheckUserDuration("--timeout", kMaxUserDuration + absl::Seconds(1), DurationRule::kPositive)
          .ok());
}

TEST(DurationCheckTest, GracePeriodMayBeZeroNeverNegative) {
  EXPECT_TRUE(
      CheckUserDuration("--grace-period", absl::ZeroDuration(), DurationRule::kNonNegative).ok());
  EXPECT_EQ(Message(CheckUserDuration("--grace-period", absl::Seconds(-1),
                                      DurationRule::kNonNegative)),
            "--grace-period=-1s: expected a finite duration >= 0 and at most 8760h (e.g. 30s, "
            "5m, 2h)");
  EXPECT_FALSE(CheckUserDuration("--grace-period", absl::InfiniteDuration(),
                                 DurationRule::kNonNegative)
                   .ok());
}

TEST(DurationCheckTest, InfiniteOnlyWhereItMeansNoLimit) {
  EXPECT_TRUE(CheckUserDuration("--timeout", absl::InfiniteDuration(),
                                DurationRule::kPositiveOrInfinite)
                  .ok());
  EXPECT_FALSE(CheckUserDuration("--timeout", -absl::InfiniteDuration(),
                                 DurationRule::kPositiveOrInfinite)
                   .ok());
  EXPECT_THAT(Message(CheckUserDuration("--timeout", absl::ZeroDuration(),
                                        DurationRule::kPositiveOrInfinite)),
              ::testing::HasSubstr(", or inf for no limit"));
}

}  // namespace
}  // namespace tpudist::tpu_runtime
