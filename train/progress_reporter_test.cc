#include "train/progress_reporter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>

namespace tpudist::train {
namespace {

TEST(ProgressTest, Bar) {
  EXPECT_EQ(FormatBar(0, 10, 10), "[..........]");
  EXPECT_EQ(FormatBar(5, 10, 10), "[#####.....]");
  EXPECT_EQ(FormatBar(10, 10, 4), "[####]");
  EXPECT_EQ(FormatBar(99, 10, 4), "[####]");
  EXPECT_EQ(FormatBar(1, 3, 4), "[#...]");
  EXPECT_EQ(FormatBar(1, 0, 3), "[...]");
}

TEST(ProgressTest, Lines) {
  EXPECT_EQ(FormatProgressBarLine(1, 3, 5, 100, 3.14159, 10),
            "Epoch 1/3 [..........]   5/100 loss=3.1416");
  EXPECT_EQ(FormatProgressPlainLine(2, 3, 40, 64, 2.5),
            "Epoch 2/3 step 40/64 loss=2.5000");
}

TEST(ProgressTest, TtyRedrawsInPlace) {
  std::ostringstream out;
  ProgressReporter p(out, {true, true, 10, 4});
  p.BeginEpoch(1, 2, 4);
  for (int s = 1; s <= 4; ++s) p.Update(s, 1.0);
  p.EndEpoch();
  const std::string s = out.str();
  EXPECT_EQ(std::count(s.begin(), s.end(), '\r'), 4);
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 1);
  EXPECT_EQ(s.back(), '\n');
  EXPECT_NE(s.find("[####] 4/4"), std::string::npos);
}

TEST(ProgressTest, PlainPrintsPeriodicallyAndAtTheEnd) {
  std::ostringstream out;
  ProgressReporter p(out, {true, false, 10, 30});
  p.BeginEpoch(1, 1, 25);
  for (int s = 1; s <= 25; ++s) p.Update(s, 0.5);
  p.EndEpoch();
  EXPECT_EQ(out.str(),
            "Epoch 1/1 step 10/25 loss=0.5000\n"
            "Epoch 1/1 step 20/25 loss=0.5000\n"
            "Epoch 1/1 step 25/25 loss=0.5000\n");
}

TEST(ProgressTest, DisabledOnOtherRanks) {
  std::ostringstream out;
  ProgressReporter p(out, {false, true, 1, 30});
  p.BeginEpoch(1, 1, 3);
  p.Update(1, 1.0);
  p.EndEpoch();
  EXPECT_TRUE(out.str().empty());
}

TEST(ProgressTest, IsTerminalIsFalseForFiles) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  EXPECT_FALSE(IsTerminal(f));
  std::fclose(f);
  EXPECT_FALSE(IsTerminal(nullptr));
}

}  // namespace
}  // namespace tpudist::train
