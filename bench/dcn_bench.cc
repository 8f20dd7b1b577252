// dcn_bench: all_reduce over a group spanning emulated slices, with the DCN
// between them shaped (tpurun --dcn-rate, tpu_runtime/launcher/dcn_link.h),
// three ways side by side in one run, and the DCN bytes each moves as the
// kernel counted them:
//   slice  tpu_dist's world group: the slice-hierarchical SliceBackend
//          (reduce-scatter inside each slice, all-reduce of the shards
//          between ranks of equal in-slice position, all-gather inside);
//   gloo   Gloo over the same ranks;
//   flat   tpu_dist with every rank placed as its own host of one slice: a
//          flat TCP ring over all ranks (slice-major order), same links.
// Every rank must run under tpurun --dcn-rate: each slice is a network
// namespace whose eth0 carries exactly the bytes it sends to other slices
// (TPU_DIST_DCN_INTERFACE). Rank 0 of each slice reads that interface's
// tx_bytes after a barrier before and after each timed loop; the bytes
// include TCP/IP headers, ACKs of the reverse direction, one control barrier
// and the coordination heartbeats in that window. Rank 0 prints the table.
//
//   tpurun --accelerator-type v6e --topology 2x2 --hosts-emulated --num-slices 2
//     --dcn-rate 1gbit -- build/bench/dcn_bench --sizes=16777216,268435456 --iters=2
//   (one command line)
#include <ATen/ATen.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/proc_stats.h"
#include "distributed/init_process_group.h"
#include "distributed/job.h"
#include "distributed/rank_main.h"

ABSL_FLAG(std::string, sizes, "16777216", "comma list of all_reduce sizes in bytes (fp32)");
ABSL_FLAG(int, iters, 3, "timed all_reduces per (backend, size), after one warm-up");
ABSL_FLAG(std::string, backends, "slice,gloo,flat", "which of slice, gloo, flat, in this order");
ABSL_FLAG(std::string, label, "", "a note printed with the table (e.g. the --dcn-rate)");

namespace dist = ::tpudist::distributed;
namespace tr = ::tpudist::tpu_runtime;

namespace {

// This slice's bytes sent into the DCN so far; -1 when not shaped.
int64_t DcnTxBytes() {
  const char* iface = getenv("TPU_DIST_DCN_INTERFACE");
  if (iface == nullptr) return -1;
  std::ifstream in(absl::StrCat("/sys/class/net/", iface, "/statistics/tx_bytes"));
  int64_t v = -1;
  in >> v;
  return in ? v : -1;
}

// Payload bytes this process has sent on its TCP connections to hosts of
// other slices (peers 10.251.<t>.* with t != slice): the kernel's per-socket
// bytes_sent (ss -tinp), summed over this pid's sockets. -1 when ss fails.
int64_t RankDcnBytesSent(int slice) {
  FILE* ss = popen("ss -Htinp 2>/dev/null", "r");
  if (ss == nullptr) return -1;
  const std::string own = absl::StrCat("pid=", getpid(), ","), dcn = "10.251.";
  const std::string same = absl::StrCat("10.251.", slice, ".");
  int64_t total = 0;
  bool counting = false;  // the last socket line was ours and to another slice
  char buf[8192];
  while (fgets(buf, sizeof(buf), ss) != nullptr) {
    absl::string_view line = buf;
    if (line.empty()) continue;
    if (line[0] != ' ' && line[0] != '\t') {
      std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      const absl::string_view peer = f.size() > 4 ? f[4] : "";
      counting = absl::StrContains(line, own) && absl::StartsWith(peer, dcn) &&
                 !absl::StartsWith(peer, same);
      continue;
    }
    const size_t at = line.find("bytes_sent:");
    int64_t sent = 0;
    if (counting && at != absl::string_view::npos) {
      absl::string_view rest = line.substr(at + 11);
      if (absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &sent)) total += sent;
    }
    counting = false;
  }
  return pclose(ss) == 0 ? total : -1;
}

std::string CpuName() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "?";
}

struct Row {
  std::string backend;
  int64_t bytes = 0;
  double seconds_per_op = 0;             // max over ranks
  std::vector<double> dcn_bytes_per_op;  // [num_slices]
  std::vector<double> rank_bytes_per_op;  // [world]
};

absl::Status Bench(dist::Job& job) {
  const tr::RankInfo& info = job.info();
  const int world = info.world_size, per_slice = info.devices_per_slice();
  const int num_slices = info.num_slices, me = info.rank;
  std::vector<int> ranks(world);
  for (int r = 0; r < world; ++r) ranks[r] = r;
  dist::GroupConfig ctl_cfg = job.group_config();
  ctl_cfg.backend = dist::BackendKind::kGloo;
  ctl_cfg.group_name = "dcn_ctl";
  absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> ctl =
      dist::NewGroup(ctl_cfg, job.store(), me, ranks);
  if (!ctl.ok()) return ctl.status();

  std::vector<Row> rows;
  for (absl::string_view backend : absl::StrSplit(absl::GetFlag(FLAGS_backends), ',')) {
    dist::GroupConfig cfg = job.group_config();
    cfg.group_name = absl::StrCat("dcn_", backend);
    if (backend == "gloo") {
      cfg.backend = dist::BackendKind::kGloo;
    } else if (backend == "flat") {
      cfg.tpu_dist.host_id = absl::StrCat("flat-rank-", me);  // each rank its own host
      cfg.tpu_dist.slice_id = -1;                             // all in one slice
    } else if (backend != "slice") {
      return absl::InvalidArgumentError(absl::StrCat("--backends: unknown \"", backend, "\""));
    }
    absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> pg =
        dist::NewGroup(cfg, job.store(), me, ranks);
    if (!pg.ok()) return pg.status();
    for (absl::string_view size_text : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
      int64_t bytes = 0;
      if (!absl::SimpleAtoi(size_text, &bytes) || bytes < 4) {
        return absl::InvalidArgumentError(absl::StrCat("--sizes: bad size \"", size_text, "\""));
      }
      const int iters = absl::GetFlag(FLAGS_iters);
      std::vector<at::Tensor> t = {at::ones({bytes / 4}, at::kFloat)};  // [bytes / 4]
      (*pg)->allreduce(t)->wait();  // warm-up
      (*ctl)->barrier()->wait();
      const bool reader = me % per_slice == 0;
      const int64_t before = reader ? DcnTxBytes() : 0;
      const int64_t rank_before = RankDcnBytesSent(info.slice_index);
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) (*pg)->allreduce(t)->wait();
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      (*ctl)->barrier()->wait();
      const int64_t after = reader ? DcnTxBytes() : 0;
      const int64_t rank_after = RankDcnBytesSent(info.slice_index);
      // ones summed iters + 1 times over the world: world^(iters+1), exact in fp32 here.
      double expected = 1;
      for (int i = 0; i <= iters; ++i) expected *= world;
      if (t[0][0].item<double>() != expected || t[0][-1].item<double>() != expected) {
        return absl::InternalError(absl::StrCat("rank ", me, " ", backend, " ", bytes, " B: got ",
                                                t[0][0].item<double>(), ", expected ", expected));
      }
      std::vector<at::Tensor> time = {at::full({1}, elapsed / iters, at::kDouble)};
      c10d::AllreduceOptions max;
      max.reduceOp = c10d::ReduceOp::MAX;
      (*ctl)->allreduce(time, max)->wait();
      std::vector<at::Tensor> dcn = {at::zeros({num_slices}, at::kDouble)};  // [num_slices]
      if (reader) dcn[0][info.slice_index] = static_cast<double>(after - before) / iters;
      if (reader && (before < 0 || after < 0)) dcn[0][info.slice_index] = -1.0;
      (*ctl)->allreduce(dcn)->wait();
      std::vector<at::Tensor> per_rank = {at::zeros({world}, at::kDouble)};  // [world]
      per_rank[0][me] = rank_before < 0 || rank_after < 0
                            ? -1.0
                            : static_cast<double>(rank_after - rank_before) / iters;
      (*ctl)->allreduce(per_rank)->wait();
      Row row{std::string(backend), bytes, time[0][0].item<double>(), {}, {}};
      for (int s = 0; s < num_slices; ++s) row.dcn_bytes_per_op.push_back(dcn[0][s].item<double>());
      for (int r = 0; r < world; ++r) row.rank_bytes_per_op.push_back(per_rank[0][r].item<double>());
      rows.push_back(row);
    }
  }
  if (me != 0) return absl::OkStatus();

  char date[64];
  const time_t now = ::time(nullptr);
  strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", gmtime(&now));
  printf("dcn_bench %s, %s, load average %.2f, %d slices x %d ranks%s%s\n", date, CpuName().c_str(),
         tpudist::bench::LoadAverage(), num_slices, per_slice,
         absl::GetFlag(FLAGS_label).empty() ? "" : ", ", absl::GetFlag(FLAGS_label).c_str());
  printf("%-6s %11s %9s %8s %14s %14s %14s %8s %8s %9s\n", "group", "bytes", "ms/op",
         "algGB/s", "eth0 B/op/sl", "rank mean B/op", "rank max B/op", "mean/flt", "max/flt",
         "time/flat");
  for (const Row& row : rows) {
    double slice_avg = 0;
    for (double b : row.dcn_bytes_per_op) slice_avg += b / num_slices;
    const Row* flat = nullptr;
    for (const Row& r : rows) {
      if (r.backend == "flat" && r.bytes == row.bytes) flat = &r;
    }
    auto mean = [](const std::vector<double>& v) {
      double m = 0;
      for (double b : v) m += b / v.size();
      return m;
    };
    auto max = [](const std::vector<double>& v) {
      double m = 0;
      for (double b : v) m = std::max(m, b);
      return m;
    };
    auto ratio = [](double a, double b) { return b > 0 ? absl::StrFormat("%.3f", a / b) : "-"; };
    const double rmean = mean(row.rank_bytes_per_op), rmax = max(row.rank_bytes_per_op);
    printf("%-6s %11lld %9.1f %8.3f %14.0f %14.0f %14.0f %8s %8s %9s\n", row.backend.c_str(),
           static_cast<long long>(row.bytes), row.seconds_per_op * 1e3,
           row.bytes / row.seconds_per_op / 1e9, slice_avg, rmean, rmax,
           flat ? ratio(rmean, mean(flat->rank_bytes_per_op)).c_str() : "-",
           flat ? ratio(rmax, max(flat->rank_bytes_per_op)).c_str() : "-",
           flat ? ratio(row.seconds_per_op, flat->seconds_per_op).c_str() : "-");
  }
  printf("(eth0 B/op/sl: each slice's DCN interface tx_bytes per op (headers, ACKs, control "
         "included), mean over slices; rank B/op: TCP payload each rank sent to other slices "
         "(per-socket bytes_sent), mean and max over %d ranks)\n", world);
  for (const Row& row : rows) {
    printf("per rank %-5s %11lld:", row.backend.c_str(), static_cast<long long>(row.bytes));
    for (double b : row.rank_bytes_per_op) printf(" %.0f", b);
    printf("\n");
  }
  fflush(stdout);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return dist::RunRankMain("dcn_bench", [&](const tr::RankInfo& info) {
    dist::JobOptions o;
    o.name = o.group.group_name = "dcn_bench";
    o.group.timeout = absl::Minutes(5);
    return dist::RunJob(info, o, Bench);
  });
}
