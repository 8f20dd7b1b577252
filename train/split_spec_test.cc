#include "train/split_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tpudist::train {
namespace {

using ::testing::HasSubstr;

RowRange Resolve(absl::string_view text, int64_t n) {
  auto spec = ParseSplit(text);
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto range = ResolveSplit(*spec, n, text);
  EXPECT_TRUE(range.ok()) << range.status();
  return range.ok() ? *range : RowRange{-1, -1};
}

TEST(SplitSpecTest, ParsesForms) {
  auto s = ParseSplit("train");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->name, "train");
  EXPECT_FALSE(s->begin.has_value());
  EXPECT_FALSE(s->end.has_value());

  s = ParseSplit("train[100:200]");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s->begin, (SplitBound{100, false}));
  EXPECT_EQ(*s->end, (SplitBound{200, false}));

  s = ParseSplit("validation[:10%]");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->name, "validation");
  EXPECT_FALSE(s->begin.has_value());
  EXPECT_EQ(*s->end, (SplitBound{10, true}));

  s = ParseSplit("train[-100:]");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s->begin, (SplitBound{-100, false}));
  EXPECT_FALSE(s->end.has_value());
}

TEST(SplitSpecTest, ResolvesLikeHfDatasets) {
  // Oracle: Python slicing of range(n), with percent -> round(p * n / 100).
  EXPECT_EQ(Resolve("train", 1500).begin, 0);
  EXPECT_EQ(Resolve("train", 1500).end, 1500);
  EXPECT_EQ(Resolve("train[:1024]", 1500).end, 1024);
  EXPECT_EQ(Resolve("train[100:200]", 1500).begin, 100);
  EXPECT_EQ(Resolve("train[100:200]", 1500).size(), 100);
  EXPECT_EQ(Resolve("train[:10%]", 1500).end, 150);
  EXPECT_EQ(Resolve("train[:10%]", 15).end, 2);     // 1.5 rounds to 2
  EXPECT_EQ(Resolve("train[:10%]", 14).end, 1);     // 1.4 rounds to 1
  EXPECT_EQ(Resolve("train[-100:]", 1500).begin, 1400);
  EXPECT_EQ(Resolve("train[-100:]", 1500).end, 1500);
  EXPECT_EQ(Resolve("train[-10%:]", 1000).begin, 900);
  EXPECT_EQ(Resolve("train[10%:-10%]", 1000).begin, 100);
  EXPECT_EQ(Resolve("train[10%:-10%]", 1000).end, 900);
  EXPECT_EQ(Resolve("train[:5000]", 1500).end, 1500);  // clamped
  EXPECT_EQ(Resolve("train[-5000:]", 1500).begin, 0);  // clamped
  EXPECT_EQ(Resolve("train[:100%]", 7).end, 7);
}

TEST(SplitSpecTest, MalformedNamesTheValue) {
  for (const char* bad :
       {"", "[:10]", "train[", "train[10]", "train[1:2:3]", "train[a:]",
        "train[:1.5%]", "train[:+5]", "train[:101%]", "tr ain", "train[ 1:]",
        "train]", "train[:10%%]", "train[:-]", "train[:10]x"}) {
    auto s = ParseSplit(bad);
    EXPECT_FALSE(s.ok()) << "accepted '" << bad << "'";
    if (!s.ok()) {
      EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(s.status().message()),
                  HasSubstr("'" + std::string(bad) + "'"));
    }
  }
}

TEST(SplitSpecTest, EmptyRangeIsAnError) {
  for (const char* text : {"train[200:100]", "train[1500:]", "train[:0]",
                           "train[:0%]", "train[-0:0]"}) {
    auto spec = ParseSplit(text);
    ASSERT_TRUE(spec.ok()) << text;
    auto r = ResolveSplit(*spec, 1500, text);
    EXPECT_FALSE(r.ok()) << text;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(text));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("1500 rows"));
  }
  auto spec = ParseSplit("train");
  EXPECT_FALSE(ResolveSplit(*spec, 0, "train").ok());
}

}  // namespace
}  // namespace tpudist::train
