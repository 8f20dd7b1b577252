#include "tpu_runtime/launcher/line_prefixer.h"

#include <string>

#include "gtest/gtest.h"

namespace tpudist::tpu_runtime::launcher {
namespace {

TEST(RankLabelTest, WidthFollowsLargestRank) {
  EXPECT_EQ(RankLabel(0, 1), "[rank 0] ");
  EXPECT_EQ(RankLabel(3, 10), "[rank 3] ");   // largest rank 9: one digit
  EXPECT_EQ(RankLabel(3, 11), "[rank  3] ");  // largest rank 10: two digits
  EXPECT_EQ(RankLabel(3, 16), "[rank  3] ");
  EXPECT_EQ(RankLabel(15, 16), "[rank 15] ");
  EXPECT_EQ(RankLabel(7, 1000), "[rank   7] ");
  EXPECT_EQ(RankLabel(999, 1000), "[rank 999] ");
}

TEST(LinePrefixerTest, PrefixesCompleteLinesAndHoldsPartialOnes) {
  LinePrefixer p("[rank  3] ");
  EXPECT_EQ(p.Feed("hel"), "");
  EXPECT_EQ(p.pending_bytes(), 3u);
  EXPECT_EQ(p.Feed("lo\nwor"), "[rank  3] hello\n");
  EXPECT_EQ(p.Feed("ld\nx\ny\n"), "[rank  3] world\n[rank  3] x\n[rank  3] y\n");
  EXPECT_EQ(p.pending_bytes(), 0u);
  EXPECT_EQ(p.Finish(), "");
}

TEST(LinePrefixerTest, FinishFlushesPartialLineWithNewline) {
  LinePrefixer p("> ");
  EXPECT_EQ(p.Feed("a\ntail"), "> a\n");
  EXPECT_EQ(p.Finish(), "> tail\n");
  EXPECT_EQ(p.Finish(), "");
  EXPECT_EQ(p.Feed("again\n"), "> again\n");  // reusable after Finish
}

TEST(LinePrefixerTest, EmptyLinesAndEmptyInput) {
  LinePrefixer p("P ");
  EXPECT_EQ(p.Feed(""), "");
  EXPECT_EQ(p.Feed("\n\n"), "P \nP \n");
}

TEST(LinePrefixerTest, ByteAtATimeEqualsWholeStream) {
  const std::string stream = "first line\nsecond\n\nthird without end";
  LinePrefixer whole("[r] "), bytewise("[r] ");
  std::string a = whole.Feed(stream);
  a += whole.Finish();
  std::string b;
  for (char c : stream) b += bytewise.Feed(std::string(1, c));
  b += bytewise.Finish();
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, "[r] first line\n[r] second\n[r] \n[r] third without end\n");
}

TEST(LinePrefixerTest, OverlongLinesAreSplitAtMaxLine) {
  LinePrefixer p("#", /*max_line=*/4);
  EXPECT_EQ(p.Feed("abcdefghij"), "#abcd\n#efgh\n");
  EXPECT_EQ(p.pending_bytes(), 2u);
  EXPECT_EQ(p.Feed("\n"), "#ij\n");
  // A line of exactly max_line bytes plus its newline stays one line.
  EXPECT_EQ(p.Feed("wxyz\n"), "#wxyz\n");
}

}  // namespace
}  // namespace tpudist::tpu_runtime::launcher
