#include "bench/alternated_configs.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/proc_stats.h"
#include "testing/forked_ranks.h"

namespace tpudist::bench {

bool ParseAlternatedFlags(int argc, char** argv, AlternatedFlags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq);
    int64_t n = 0;
    if (eq == std::string::npos || !absl::SimpleAtoi(a.substr(eq + 1), &n) || n <= 0) return false;
    if (key == "--world") {
      f->world = static_cast<int>(n);
    } else if (key == "--bytes" && n % 4 == 0) {
      f->bytes = n;
    } else if (key == "--ops") {
      f->ops = n;
    } else if (key == "--rounds") {
      f->rounds = static_cast<int>(n);
    } else {
      return false;
    }
  }
  return true;
}

int RunForkedRanks(const std::string& name, const AlternatedFlags& flags,
                   const std::function<int(int rank, const std::string& dir,
                                           const std::string& job_id)>& body) {
  std::string tmpl = absl::StrCat("/tmp/", name, ".XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) return 1;
  const std::string dir = tmpl;
  const std::string job_id = absl::StrCat(name, "_", getpid());
  const test_support::ForkedRanks ranks = test_support::ForkRanks(flags.world);
  const int rc = body(ranks.rank, dir, job_id);
  if (ranks.rank != 0) _exit(rc);
  const absl::Status all = test_support::WaitForRanks(ranks, absl::Minutes(10));
  std::remove((dir + "/store").c_str());
  rmdir(dir.c_str());
  if (!all.ok()) {
    std::fprintf(stderr, "%s\n", std::string(all.message()).c_str());
    return 1;
  }
  return rc;
}

std::vector<std::vector<double>> AlternateRounds(const AlternatedFlags& flags, int configs,
                                                 const std::function<double(int c)>& time_round) {
  std::vector<std::vector<double>> seconds(configs);
  for (int round = 0; round < flags.rounds; ++round) {
    for (int c = 0; c < configs; ++c) seconds[c].push_back(time_round(c));
  }
  return seconds;
}

void PrintConfigTable(const std::string& what, const AlternatedFlags& flags, double load_before,
                      const std::vector<std::string>& names,
                      const std::vector<std::vector<double>>& seconds) {
  std::printf("%s, world %d, %lld ops x %d rounds alternated; load average %.2f -> %.2f; "
              "us per op\n",
              what.c_str(), flags.world, static_cast<long long>(flags.ops), flags.rounds,
              load_before, LoadAverage());
  std::printf("%-24s %10s %10s %14s\n", "configuration", "median", "min", "median / first");
  double first = 0;
  for (size_t c = 0; c < names.size() && c < seconds.size(); ++c) {
    std::vector<double> v = seconds[c];
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    const double median = v[v.size() / 2] * 1e6;
    if (c == 0) first = median;
    std::printf("%-24s %10.3f %10.3f %14.2f\n", names[c].c_str(), median, v.front() * 1e6,
                first > 0 ? median / first : 0.0);
  }
}

}  // namespace tpudist::bench
