// tpurun: starts one process per device of a (possibly emulated) TPU slice,
// or N plain torchrun-style processes, and supervises them.
//
//   tpurun --accelerator-type TPU-V6E --topology 4x4 --hosts-emulated -- ./bin args
//   tpurun --accelerator-type tpu7x --topology 2x2x2 --host-index 1 -- ./bin
//   tpurun --nproc 4 -- ./bin
//   tpurun --accelerator-type v6e --topology 2x2 --hosts-emulated --num-slices 2 -- ./bin
//
// Slice mode with --hosts-emulated runs every host's ranks on this machine;
// each rank sees the environment it would see on its own host (host h is
// 127.0.1.<h+1>). Without it, tpurun starts only this host's ranks: the host
// index comes from --host-index, else TPU_WORKER_ID, else 0, and the host
// list from --hostnames, else TPU_WORKER_HOSTNAMES; run one tpurun per host
// with the same flags (and the same --master-port, default 29500).
// --num-slices N (with --hosts-emulated) runs N slices of that shape, each
// with its own hosts (slice s host h: 127.0.<s+1>.<h+1>), ranks slice-major,
// and gives every rank the MEGASCALE_* variables of a multi-slice job.
// --dcn-rate R / --dcn-delay D (with --num-slices N > 1) make the link between
// slices a shaped one: each slice runs in its own network namespace (hosts
// 10.251.<s>.<h+1>) whose link into the DCN bridge is limited to R (htb) and
// delayed by D (netem); at the end tpurun prints the bytes each slice sent
// into the DCN ("tpurun: dcn: slice s sent N bytes ..."), counted by the
// kernel, and deletes the namespaces (dcn_link.h).
//
// Flags may be spelled with '-' or '_'. Exit status: 0 if every rank
// succeeded; the root-cause rank's exit status (128+signal if killed); 75
// when this tpurun's ranks only stopped because another rank failed (with
// one tpurun per host: a rank of another host); 124 on --timeout;
// 128+signal if tpurun itself was interrupted; 2 for bad flags, durations
// and secret files; 1 if the launcher could not do its job.
//
// Flight recorder: the ranks dump their recent collectives
// (TPU_DIST_FLIGHT_RECORDER_DIR, set by tpurun to a per-job directory unless
// the user set it or TORCH_FR_DUMP_TEMP_FILE). When a rank fails, tpurun
// sends SIGUSR1 to the ranks that have not dumped yet (if any rank has),
// waits up to 2 s for their dumps, stops the job, and prints the verdict of
// torch's analyzer (flight_recorder_verdict.h) in lines starting
// "tpurun: flight recorder: ".
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "tpu_runtime/duration_check.h"
#include "tpu_runtime/job_secret.h"
#include "tpu_runtime/launcher/dcn_link.h"
#include "tpu_runtime/launcher/flag_names.h"
#include "tpu_runtime/launcher/flight_recorder_verdict.h"
#include "tpu_runtime/launcher/free_port.h"
#include "tpu_runtime/launcher/launch_plan.h"
#include "tpu_runtime/launcher/process_group_supervisor.h"
#include "tpu_runtime/slice_env.h"

ABSL_FLAG(std::string, accelerator_type, "", "TPU type, e.g. TPU-V6E, v5e, tpu7x (slice mode)");
ABSL_FLAG(std::string, topology, "", "chip topology, e.g. 4x4 or 2x2x2 (slice mode)");
ABSL_FLAG(bool, hosts_emulated, false, "run all hosts of the slice on this machine");
ABSL_FLAG(int, num_slices, 1,
          "slice mode with --hosts-emulated: emulate N slices of this accelerator/topology, "
          "each with its own hosts (slice s host h at 127.0.<s+1>.<h+1>); ranks are "
          "slice-major and get MEGASCALE_NUM_SLICES / _SLICE_ID / _COORDINATOR_ADDRESS / _PORT");
ABSL_FLAG(std::string, dcn_rate, "",
          "with --hosts-emulated --num-slices >= 2: shape each slice's link into the DCN to this "
          "rate (tc units: 10gbit, 500mbit); the slices then run in network namespaces "
          "(tpu_runtime/launcher/dcn_link.h); default: unshaped");
ABSL_FLAG(absl::Duration, dcn_delay, absl::ZeroDuration(),
          "like --dcn-rate: add this one-way delay (e.g. 100us) on each slice's DCN link "
          "(needs the kernel's netem qdisc); 0: none");
ABSL_FLAG(int, megascale_port, 8081, "with --num-slices > 1: MEGASCALE_PORT of every rank");
ABSL_FLAG(int, host_index, -1, "this host's index (default: TPU_WORKER_ID, else 0)");
ABSL_FLAG(std::string, hostnames, "",
          "comma list of host addresses, every slice's, slice-major (default: "
          "TPU_WORKER_HOSTNAMES when not emulated, else 127.0.<s+1>.<h+1>)");
ABSL_FLAG(int, nproc, 0, "plain mode: number of processes (no TPU variables)");
ABSL_FLAG(int, max_restarts, 0,
          "restart the whole group up to N times after a failure (not with one tpurun per "
          "host: refused)");
ABSL_FLAG(int, master_port, 0, "MASTER_PORT (default: a free port per attempt; 29500 multi-host)");
ABSL_FLAG(std::string, master_addr, "", "MASTER_ADDR (default: 127.0.0.1 / the first host)");
ABSL_FLAG(absl::Duration, grace_period, absl::Seconds(5),
          "SIGTERM -> SIGKILL grace period (>= 0, e.g. 5s)");
ABSL_FLAG(absl::Duration, timeout, absl::InfiniteDuration(),
          "stop the job after this long (> 0, e.g. 2h; inf: no limit)");
ABSL_FLAG(std::string, job_id, "", "job id (TPU_DIST_JOB_ID); default: generated");
ABSL_FLAG(std::string, job_secret_file, "",
          "file holding the job secret that authenticates the ranks' connections (default: "
          "TPU_DIST_JOB_SECRET or TPU_DIST_JOB_SECRET_FILE, else generated; a multi-host job "
          "needs the same one on every host)");
ABSL_FLAG(bool, allow_unauthenticated, false,
          "multi-host without --hosts-emulated: run without a job secret (anyone who can reach "
          "the ranks' ports can join the job)");

ABSL_FLAG(std::string, fr_analyzer, "",
          "Python (with torch) that runs torch's flight-recorder analyzer after a failed attempt "
          "(default: TPU_DIST_FR_ANALYZER, else the rank command when it is a python, else "
          "$VIRTUAL_ENV/bin/python, else python3); none: no analysis");
ABSL_FLAG(absl::Duration, fr_analyzer_timeout, absl::Seconds(30),
          "the analyzer is killed after this long (> 0)");

namespace tpudist::tpu_runtime::launcher {
namespace {

constexpr int kUsageError = 2;

int Fail(int code, const std::string& message) {
  fprintf(stderr, "tpurun: %s\n", message.c_str());
  return code;
}

// The secret every rank gets (tpu_runtime/job_secret.h): --job-secret-file,
// else TPU_DIST_JOB_SECRET / _FILE, else one generated here when this tpurun
// starts every rank of the job. Hosts of a real multi-host job must share
// one, which a per-host generated secret cannot be: there it must be given
// (or --allow-unauthenticated). A file stays a file (ranks read it, the
// secret stays out of their environment); tpurun's own variables are
// removed so that ranks see exactly one of the two.
absl::Status ResolveJobSecret(LaunchConfig* config) {
  const std::string flag_file = absl::GetFlag(FLAGS_job_secret_file);
  const char* env_file = getenv(kJobSecretFileEnv);
  const bool from_env_value = getenv(kJobSecretEnv) != nullptr;
  absl::StatusOr<std::string> secret = !flag_file.empty()
                                           ? ReadJobSecretFile(flag_file, "--job-secret-file")
                                           : JobSecretFromProcessEnv();
  if (!secret.ok()) return secret.status();
  const std::string file = !flag_file.empty() ? flag_file : env_file != nullptr ? env_file : "";
  const bool multi_host = IsOneOfManyHosts(*config);
  std::string what;
  if (!secret->empty() && !file.empty() && (!flag_file.empty() || !from_env_value)) {
    char* absolute = realpath(file.c_str(), nullptr);
    config->job_secret_file = absolute != nullptr ? absolute : file;
    free(absolute);
    what = absl::StrCat("from ", config->job_secret_file);
  } else if (!secret->empty()) {
    config->job_secret_hex = JobSecretHex(*secret);
    what = "from TPU_DIST_JOB_SECRET";
  } else if (multi_host) {
    if (!absl::GetFlag(FLAGS_allow_unauthenticated)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "this is host ", config->host_index, " of a ", config->slice.num_hosts,
          "-host job: every host's tpurun must give its ranks the same job secret, so it cannot "
          "be generated here. Set TPU_DIST_JOB_SECRET (e.g. `openssl rand -hex 32`) or "
          "TPU_DIST_JOB_SECRET_FILE on every host, or pass --job-secret-file; "
          "--allow-unauthenticated runs without one"));
    }
    what = "none (--allow-unauthenticated: the ranks' ports accept anyone)";
  } else {
    absl::StatusOr<std::string> generated = GenerateJobSecret();
    if (!generated.ok()) return generated.status();
    config->job_secret_hex = JobSecretHex(*generated);
    what = "generated for this job";
  }
  unsetenv(kJobSecretEnv);
  unsetenv(kJobSecretFileEnv);
  fprintf(stderr, "tpurun: job secret: %s\n", what.c_str());
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);  // a closed output pipe must not kill the launcher
  absl::SetProgramUsageMessage(
      "tpurun (--accelerator-type T --topology AxB [--hosts-emulated [--num-slices N]] | "
      "--nproc N) "
      "[flags] -- binary args");
  NormalizedArgv args(argc, argv);
  std::vector<char*> positional = absl::ParseCommandLine(args.argc(), args.argv());

  LaunchConfig config;
  config.command.assign(positional.begin() + 1, positional.end());
  config.job_id = absl::GetFlag(FLAGS_job_id);
  if (config.job_id.empty()) config.job_id = GenerateJobId();
  config.master_addr = absl::GetFlag(FLAGS_master_addr);
  config.set_omp_num_threads = getenv("OMP_NUM_THREADS") == nullptr;
  const bool slice_mode =
      !absl::GetFlag(FLAGS_accelerator_type).empty() || !absl::GetFlag(FLAGS_topology).empty();
  if (slice_mode == (absl::GetFlag(FLAGS_nproc) > 0)) {
    return Fail(kUsageError, "give either --accelerator-type and --topology, or --nproc N");
  }
  if (slice_mode) {
    absl::StatusOr<SliceSpec> spec =
        SliceSpecFromFlags(absl::GetFlag(FLAGS_accelerator_type), absl::GetFlag(FLAGS_topology));
    if (!spec.ok()) return Fail(kUsageError, std::string(spec.status().message()));
    config.mode = LaunchConfig::Mode::kSlice;
    config.slice = *spec;
    config.hosts_emulated = absl::GetFlag(FLAGS_hosts_emulated);
    config.num_slices = absl::GetFlag(FLAGS_num_slices);
    config.megascale_port = absl::GetFlag(FLAGS_megascale_port);
    config.host_index = absl::GetFlag(FLAGS_host_index);
    const char* worker_id = getenv("TPU_WORKER_ID");
    if (config.host_index < 0 && worker_id != nullptr &&
        !absl::SimpleAtoi(worker_id, &config.host_index)) {
      return Fail(kUsageError, absl::StrCat("TPU_WORKER_ID=\"", worker_id, "\" is not a number"));
    }
    if (config.host_index < 0) config.host_index = 0;
    std::string hostnames = absl::GetFlag(FLAGS_hostnames);
    const char* env_hosts = getenv("TPU_WORKER_HOSTNAMES");
    if (hostnames.empty() && !config.hosts_emulated && env_hosts != nullptr) hostnames = env_hosts;
    if (!hostnames.empty()) {
      config.hostnames = absl::StrSplit(hostnames, ',', absl::SkipEmpty());
    }
  } else {
    config.mode = LaunchConfig::Mode::kPlain;
    config.nproc = absl::GetFlag(FLAGS_nproc);
    if (absl::GetFlag(FLAGS_num_slices) != 1) {
      return Fail(kUsageError, absl::StrCat("--num-slices=", absl::GetFlag(FLAGS_num_slices),
                                            " needs slice mode (--accelerator-type, --topology, "
                                            "--hosts-emulated), not --nproc"));
    }
  }
  absl::StatusOr<DcnShape> dcn_shape =
      ParseDcnShape(absl::GetFlag(FLAGS_dcn_rate), absl::GetFlag(FLAGS_dcn_delay));
  if (!dcn_shape.ok()) return Fail(kUsageError, std::string(dcn_shape.status().message()));
  for (absl::Status s :
       {CheckDcnShapeUsable(*dcn_shape, config.num_slices, config.hosts_emulated,
                            !config.hostnames.empty()),
        ValidateLaunchConfig(config), ValidateMaxRestarts(config, absl::GetFlag(FLAGS_max_restarts)),
        CheckUserDuration("--timeout", absl::GetFlag(FLAGS_timeout),
                          DurationRule::kPositiveOrInfinite),
        CheckUserDuration("--grace-period", absl::GetFlag(FLAGS_grace_period),
                          DurationRule::kNonNegative),
        CheckUserDuration("--fr-analyzer-timeout", absl::GetFlag(FLAGS_fr_analyzer_timeout),
                          DurationRule::kPositiveOrInfinite)}) {
    if (!s.ok()) return Fail(kUsageError, std::string(s.message()));
  }

  if (absl::Status s = ResolveJobSecret(&config); !s.ok()) {
    return Fail(kUsageError, std::string(s.message()));
  }

  // The shaped DCN (dcn_link.h): the slices' namespaces live until Main returns.
  std::unique_ptr<DcnLink> dcn;
  if (dcn_shape->enabled()) {
    RemoveStaleDcnNamespaces();
    absl::StatusOr<std::unique_ptr<DcnLink>> link =
        DcnLink::Create(config.num_slices, config.slice.num_hosts, *dcn_shape);
    if (!link.ok()) return Fail(1, std::string(link.status().message()));
    dcn = std::move(*link);
    config.hostnames = dcn->Hostnames();
  }

  // Flight-recorder dumps of each attempt, and the Python that analyzes them.
  const auto lookup = [](const char* name) -> const char* { return getenv(name); };
  const std::string analyzer = ChooseAnalyzerPython(
      absl::GetFlag(FLAGS_fr_analyzer), getenv(kFlightRecorderAnalyzerEnv), config.command,
      getenv("VIRTUAL_ENV"));
  std::optional<DumpLocation> dumps;
  std::vector<int> attempt_ranks;

  const int fixed_port = absl::GetFlag(FLAGS_master_port);
  const bool pick_port = fixed_port == 0 && MayPickMasterPort(config);
  LaunchPlanner planner = [&](int restart) -> absl::StatusOr<std::vector<ProcessSpec>> {
    int port = fixed_port != 0 ? fixed_port : 29500;
    if (pick_port) {
      // Free on the address rank 0 will listen on (a hostname: on 127.0.0.1).
      std::string master = config.master_addr;
      if (master.empty() && config.mode == LaunchConfig::Mode::kSlice) {
        master = config.hostnames.empty() ? "127.0.1.1" : config.hostnames[0];
      }
      absl::StatusOr<int> free = PickFreePort(master.empty() ? "127.0.0.1" : master);
      if (!free.ok()) free = PickFreePort("127.0.0.1");
      if (!free.ok()) return free.status();
      port = *free;
    }
    absl::StatusOr<std::vector<ProcessSpec>> specs = PlanRanks(config, restart, port);
    if (!specs.ok()) return specs;
    dumps = ResolveDumpLocation(lookup, config.job_id, restart);
    attempt_ranks.clear();
    for (ProcessSpec& spec : *specs) {
      attempt_ranks.push_back(spec.rank);
      if (dumps.has_value() && dumps->set_by_launcher) spec.env[kFlightRecorderDirEnv] = dumps->dir;
      if (dcn != nullptr) {
        spec.argv = dcn->WrapArgv(spec.rank / config.slice.num_devices(), spec.argv);
        spec.env["TPU_DIST_DCN_INTERFACE"] = DcnLink::kInterface;
      }
    }
    return specs;
  };
  SupervisorOptions options;
  options.grace_period = absl::GetFlag(FLAGS_grace_period);
  options.timeout = absl::GetFlag(FLAGS_timeout);
  options.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  options.peer_failure_hint = PeerFailureHint(config);
  // Wait for the dumps only when the ranks record (one has dumped already):
  // a job that does not use tpu_dist never gets SIGUSR1.
  options.ranks_to_wait_for = [&](const std::vector<int>& running) -> std::vector<int> {
    if (!dumps.has_value() || RanksWithDumps(*dumps, attempt_ranks).empty()) return {};
    const std::vector<int> dumped = RanksWithDumps(*dumps, running);
    std::vector<int> missing;
    for (int rank : running) {
      if (std::find(dumped.begin(), dumped.end(), rank) == dumped.end()) missing.push_back(rank);
    }
    return missing;
  };
  options.before_stop_signal = SIGUSR1;
  // A slice is lost all at once: let its ranks' deaths arrive before the stop.
  if (config.num_slices > 1) options.failure_settle_time = absl::Milliseconds(300);
  options.describe_failed_ranks = [&](const std::vector<int>& failed) {
    return LostSliceLines(config, failed);
  };
  options.after_failed_attempt = [&](int /*restart*/) {
    if (!dumps.has_value()) return;
    std::vector<std::string> lines =
        FlightRecorderVerdict(*dumps, attempt_ranks, analyzer,
                              absl::GetFlag(FLAGS_fr_analyzer_timeout));
    if (!lines.empty() && IsOneOfManyHosts(config)) {
      lines.push_back("this tpurun's ranks only: put every host's dumps in one directory and run "
                      "python -m torch.distributed.flight_recorder.fr_trace on it");
    }
    for (const std::string& line : lines) {
      fprintf(stderr, "tpurun: flight recorder: %s\n", line.c_str());
    }
    fflush(stderr);
  };

  fprintf(stderr, "tpurun: %s\n", StartBanner(config).c_str());
  if (dcn != nullptr) fprintf(stderr, "tpurun: %s\n", dcn->Describe().c_str());
  fflush(stderr);
  absl::StatusOr<ExitReport> report = SuperviseProcessGroup(planner, options);
  for (int s = 0; dcn != nullptr && s < config.num_slices; ++s) {
    absl::StatusOr<int64_t> sent = dcn->TxBytes(s);
    fprintf(stderr, "tpurun: dcn: slice %d sent %s\n", s,
            sent.ok() ? absl::StrCat(*sent, " bytes to other slices (all attempts)").c_str()
                      : std::string(sent.status().message()).c_str());
  }
  if (!report.ok()) return Fail(1, absl::StrCat("error: ", report.status().ToString()));
  fprintf(stderr, "tpurun: %s\n", report->Summary().c_str());
  return report->ExitCode();
}

}  // namespace
}  // namespace tpudist::tpu_runtime::launcher

int main(int argc, char** argv) { return tpudist::tpu_runtime::launcher::Main(argc, argv); }
