#include "tpu_runtime/launcher/flight_recorder_verdict.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tpudist::tpu_runtime::launcher {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// What the pinned torch's fr_trace printed on the dumps of
// tests/python/test_flight_recorder.py (rank 1 asleep before op 3).
constexpr char kMissingOutput[] =
    "tabulate is not installed. Proceeding without it.\n"
    "unrecognized comm library 'tpu_dist' in profiling name 'tpu_dist:all_reduce'\n"
    "Not all ranks joining collective, sequence number: 3\n"
    "internal record id: 2\n"
    "group info: 0:default_pg\n"
    "collective: tpu_dist:all_reduce\n"
    "missing ranks: {1}\n"
    "input sizes: [[4]]\n"
    "collective state: started\n"
    "collective stack trace: \n"
    " \n";

// Mismatched collectives: rank 0 all_reduce, rank 1 all_gather at op 3.
constexpr char kMismatchOutput[] =
    "Collective sequence number: 3 has errors\n"
    "internal record id: 2\n"
    "collective: tpu_dist:all_gather\n"
    "error msg: Culprit rank 0; Error type: COLLECTIVE_TYPE_MISMATCH, Expected collective type: "
    "'all_gather' does not match found collective type: 'all_reduce'\n"
    "collective stack trace: \n";

std::function<const char*(const char*)> Lookup(std::map<std::string, std::string> env) {
  return [env = std::move(env)](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

// A fresh directory, removed with everything in it at the end of the test.
class ScopedDir {
 public:
  explicit ScopedDir(const std::string& name)
      : path_(absl::StrCat(::testing::TempDir(), "/frv_", getpid(), "_", name)) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScopedDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void WriteFile(const std::string& path, const std::string& text, bool executable = false) {
  FILE* f = fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr) << path;
  fputs(text.c_str(), f);
  fclose(f);
  if (executable) chmod(path.c_str(), 0755);
}

// The tpuruns this binary starts (tpurun_test.cc: failing slice_check jobs
// dump) write their flight-recorder directories under TMPDIR: one directory
// for the whole binary, removed at its end, so that no run leaves
// /tmp/tpurun_fr/<job> behind.
class DumpTmpdirEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    char pattern[] = "/tmp/launcher_test_XXXXXX";
    if (mkdtemp(pattern) == nullptr) return;
    dir_ = pattern;
    setenv("TMPDIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

 private:
  std::string dir_;
};
const ::testing::Environment* const kDumpTmpdir =
    ::testing::AddGlobalTestEnvironment(new DumpTmpdirEnvironment);

TEST(FlightRecorderVerdictTest, LauncherChoosesAPerJobAttemptDirectoryUnlessTheUserDid) {
  std::optional<DumpLocation> own = ResolveDumpLocation(Lookup({{"TMPDIR", "/t"}}), "job1", 2);
  ASSERT_TRUE(own.has_value());
  EXPECT_EQ(own->dir, "/t/tpurun_fr/job1/attempt_2");
  EXPECT_EQ(own->file_prefix, "tpu_dist_fr_rank_");
  EXPECT_TRUE(own->set_by_launcher);
  EXPECT_EQ(ResolveDumpLocation(Lookup({}), "j", 0)->dir, "/tmp/tpurun_fr/j/attempt_0");

  std::optional<DumpLocation> user =
      ResolveDumpLocation(Lookup({{kFlightRecorderDirEnv, "/mine"}}), "j", 1);
  EXPECT_EQ(user->dir, "/mine");
  EXPECT_FALSE(user->set_by_launcher);
  std::optional<DumpLocation> torch =
      ResolveDumpLocation(Lookup({{kTorchDumpPrefixEnv, "/x/trace_"}}), "j", 0);
  EXPECT_EQ(torch->dir, "/x");
  EXPECT_EQ(torch->file_prefix, "trace_");
  EXPECT_FALSE(ResolveDumpLocation(Lookup({{kFlightRecorderSizeEnv, "0"}}), "j", 0).has_value());
}

TEST(FlightRecorderVerdictTest, AnalyzerPythonComesFromFlagEnvCommandOrPath) {
  const std::vector<std::string> py = {"/venv/bin/python3.11", "train.py"};
  EXPECT_EQ(ChooseAnalyzerPython("/a/python", "/b/python", py, "/v"), "/a/python");
  EXPECT_EQ(ChooseAnalyzerPython("", "/b/python", py, "/v"), "/b/python");
  EXPECT_EQ(ChooseAnalyzerPython("", nullptr, py, "/v"), "/venv/bin/python3.11");
  EXPECT_EQ(ChooseAnalyzerPython("", nullptr, {"./slice_check"}, "/v"), "/v/bin/python");
  EXPECT_EQ(ChooseAnalyzerPython("", nullptr, {"./slice_check"}, nullptr), "python3");
  EXPECT_EQ(ChooseAnalyzerPython("none", "/b/python", py, "/v"), "");
  EXPECT_EQ(ChooseAnalyzerPython("", "none", py, "/v"), "");
}

TEST(FlightRecorderVerdictTest, VerdictLinesDropTheAnalyzersNoise) {
  EXPECT_THAT(VerdictLines(kMissingOutput, 40),
              ElementsAre("Not all ranks joining collective, sequence number: 3",
                          "internal record id: 2", "group info: 0:default_pg",
                          "collective: tpu_dist:all_reduce", "missing ranks: {1}",
                          "input sizes: [[4]]", "collective state: started"));
  EXPECT_THAT(VerdictLines("a\nb\nc\nd\n", 2), ElementsAre("a", "b", "... 2 more lines"));
}

TEST(FlightRecorderVerdictTest, HeadlineNamesTheRankAndTheSequenceId) {
  EXPECT_EQ(VerdictHeadline(VerdictLines(kMissingOutput, 40)),
            "sequence id 3, tpu_dist:all_reduce: rank 1 never joined it (behind: stuck before "
            "it, or in another op)");
  EXPECT_EQ(VerdictHeadline(VerdictLines(kMismatchOutput, 40)),
            "sequence id 3, tpu_dist:all_gather: Culprit rank 0; Error type: "
            "COLLECTIVE_TYPE_MISMATCH, Expected collective type: 'all_gather' does not match "
            "found collective type: 'all_reduce'");
  EXPECT_EQ(VerdictHeadline({"Not all ranks joining collective, sequence number: 2",
                             "collective: tpu_dist:recv 1<-0", "missing ranks: {0, 2}"}),
            "sequence id 2, tpu_dist:recv 1<-0: ranks 0, 2 never joined it (behind: stuck "
            "before it, or in another op)");
  EXPECT_EQ(VerdictHeadline({"nothing wrong"}), "");
}

TEST(FlightRecorderVerdictTest, RunsTheAnalyzerAndReportsMissingDumps) {
  ScopedDir scoped("run"), empty("empty");
  const std::string& dir = scoped.path();
  WriteFile(dir + "/tpu_dist_fr_rank_0", "dump");
  // A stand-in for the Python: prints what fr_trace prints, and its argv.
  const std::string fake = dir + "/fake_python";
  WriteFile(fake,
            absl::StrCat("#!/bin/sh\nprintf '%s' '", kMissingOutput, "'\necho \"argv: $*\"\n"),
            true);
  DumpLocation where{dir};
  EXPECT_THAT(RanksWithDumps(where, {0, 1}), ElementsAre(0));
  std::vector<std::string> lines = FlightRecorderVerdict(where, {0, 1}, fake, absl::Seconds(20));
  const std::string all = absl::StrJoin(lines, "\n");
  ASSERT_FALSE(lines.empty());
  EXPECT_THAT(lines[0], HasSubstr("verdict: sequence id 3, tpu_dist:all_reduce: rank 1 never"));
  EXPECT_THAT(all, HasSubstr("  missing ranks: {1}"));
  EXPECT_THAT(all, HasSubstr("1 of 2 ranks dumped to " + dir + " (none from ranks 1)"));
  EXPECT_THAT(all, HasSubstr("argv: -m torch.distributed.flight_recorder.fr_trace -p "
                             "tpu_dist_fr_rank_ --mismatch_cap 5 --allow-incomplete-ranks " +
                             dir));
  EXPECT_THAT(FlightRecorderVerdict(DumpLocation{empty.path()}, {0, 1}, fake,
                                    absl::Seconds(20)),
              ElementsAre());
}

TEST(FlightRecorderVerdictTest, AMissingOrHungOrTorchlessAnalyzerIsOneLine) {
  ScopedDir scoped("bad");
  const std::string& dir = scoped.path();
  WriteFile(dir + "/tpu_dist_fr_rank_0", "dump");
  DumpLocation where{dir};
  std::vector<std::string> missing =
      FlightRecorderVerdict(where, {0}, dir + "/no_such_python", absl::Seconds(20));
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_THAT(missing[0], HasSubstr("no analyzer: cannot run " + dir + "/no_such_python"));

  const std::string hangs = dir + "/hanging_python";
  WriteFile(hangs, "#!/bin/sh\nexec sleep 30\n", true);
  const absl::Time start = absl::Now();
  std::vector<std::string> hung = FlightRecorderVerdict(where, {0}, hangs, absl::Seconds(1));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_EQ(hung.size(), 1u);
  EXPECT_THAT(hung[0], HasSubstr("did not finish within 1s: killed, no verdict"));

  const std::string torchless = dir + "/torchless_python";
  WriteFile(torchless, "#!/bin/sh\necho \"No module named 'torch'\" >&2\nexit 1\n", true);
  std::vector<std::string> no_torch = FlightRecorderVerdict(where, {0}, torchless,
                                                            absl::Seconds(20));
  ASSERT_EQ(no_torch.size(), 1u);
  EXPECT_THAT(no_torch[0], HasSubstr("has no torch.distributed.flight_recorder"));

  EXPECT_THAT(FlightRecorderVerdict(where, {0}, "", absl::Seconds(20)),
              ElementsAre(HasSubstr("analyzer off (--fr-analyzer=none)")));
}

}  // namespace
}  // namespace tpudist::tpu_runtime::launcher
