#include "tpu_runtime/env_parse.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::tpu_runtime {
namespace {

using ::testing::ElementsAre;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(EnvParseTest, EmptyIsUnset) {
  EnvMap env{{"A", ""}, {"B", "x"}};
  EXPECT_FALSE(GetEnv(env, "A").has_value());
  EXPECT_FALSE(GetEnv(env, "C").has_value());
  EXPECT_EQ(*GetEnv(env, "B"), "x");
  EXPECT_FALSE(HasEnv(env, "A"));
  EXPECT_TRUE(HasEnv(env, "B"));
}

TEST(EnvParseTest, ParseIntRangesAndMessages) {
  EXPECT_EQ(*ParseInt("RANK", "7", 0, 1 << 30), 7);
  EXPECT_EQ(*ParseInt("RANK", " 7 ", 0, 1 << 30), 7);
  EXPECT_EQ(*ParseInt("X", "-3", -5, 5), -3);
  EXPECT_EQ(Message(ParseInt("RANK", "-1", 0, 1 << 30).status()),
            "RANK=\"-1\": expected a non-negative integer");
  EXPECT_EQ(Message(ParseInt("MASTER_PORT", "70000", 1, 65535).status()),
            "MASTER_PORT=\"70000\": expected an integer in 1..65535");
  for (const char* bad : {"", "abc", "1.5", "0x10", "1e3", "+3", "-", "3 4", "99999999999"}) {
    EXPECT_FALSE(ParseInt("RANK", bad, 0, 1 << 30).ok()) << bad;
  }
}

TEST(EnvParseTest, GetIntUnsetMalformedAndSet) {
  EnvMap env{{"RANK", "3"}, {"WORLD_SIZE", "four"}};
  EXPECT_EQ(**GetInt(env, "RANK"), 3);
  EXPECT_FALSE(GetInt(env, "LOCAL_RANK")->has_value());
  absl::StatusOr<std::optional<int>> w = GetInt(env, "WORLD_SIZE", 1);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(Message(w.status()), "WORLD_SIZE=\"four\": expected an integer in 1..1073741824");
}

TEST(EnvParseTest, CommaList) {
  EXPECT_THAT(*ParseCommaList("H", "a, b ,c"), ElementsAre("a", "b", "c"));
  EXPECT_THAT(*ParseCommaList("H", "a"), ElementsAre("a"));
  EXPECT_EQ(Message(ParseCommaList("H", "a,,b").status()),
            "H=\"a,,b\": expected a comma list with no empty entries");
  EXPECT_EQ(Message(ParseCommaList("H", "a,b,a").status()),
            "H=\"a,b,a\": expected distinct entries, but \"a\" repeats");
}

TEST(EnvParseTest, HostPort) {
  absl::StatusOr<HostPort> hp = ParseHostPort("S", "10.0.0.2:8471");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "10.0.0.2");
  EXPECT_EQ(hp->port, 8471);
  EXPECT_EQ(ParseHostPort("S", "[::1]:80")->host, "[::1]");
  for (const char* bad : {"host", ":80", "host:", "host:0", "host:65536", "host:x"}) {
    absl::StatusOr<HostPort> b = ParseHostPort("S", bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_THAT(Message(b.status()), ::testing::StartsWith(absl::StrCat("S=\"", bad, "\"")));
  }
}

}  // namespace
}  // namespace tpudist::tpu_runtime
