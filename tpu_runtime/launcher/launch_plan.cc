#include "tpu_runtime/launcher/launch_plan.h"

#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tpu_runtime/job_secret.h"
#include "tpu_runtime/launcher/line_prefixer.h"
#include "tpu_runtime/slice_env.h"

namespace tpudist::tpu_runtime::launcher {
namespace {

// Number of ranks this tpurun starts, and the global rank of the first.
struct LocalRange {
  int first = 0;
  int count = 0;
};

LocalRange LocalRanks(const LaunchConfig& config) {
  if (config.mode == LaunchConfig::Mode::kPlain) return {0, config.nproc};
  if (config.hosts_emulated) return {0, config.slice.num_devices() * config.num_slices};
  return {config.host_index * config.slice.devices_per_host, config.slice.devices_per_host};
}

// torchrun's variables that SliceEnvironment does not set.
void AddElasticVariables(const LaunchConfig& config, int rank, int world, EnvMap* env) {
  (*env)["ROLE_RANK"] = absl::StrCat(rank);
  (*env)["ROLE_NAME"] = "default";
  (*env)["ROLE_WORLD_SIZE"] = absl::StrCat(world);
  (*env)["TORCHELASTIC_RUN_ID"] = config.job_id;
  (*env)["TORCHELASTIC_USE_AGENT_STORE"] = "False";  // rank 0 hosts the store
  (*env)["TPU_DIST_JOB_ID"] = config.job_id;
  if (config.set_omp_num_threads) (*env)["OMP_NUM_THREADS"] = "1";
  if (!config.job_secret_hex.empty()) (*env)[kJobSecretEnv] = config.job_secret_hex;
  if (!config.job_secret_file.empty()) (*env)[kJobSecretFileEnv] = config.job_secret_file;
}

// The addresses of slice `s`'s hosts: its part of config.hostnames, else
// 127.0.<s+1>.<h+1>. One slice without --hostnames: empty (SliceEnvironment's
// own default, the same addresses).
std::vector<std::string> SliceHostnames(const LaunchConfig& config, int s) {
  const int hosts = config.slice.num_hosts;
  if (!config.hostnames.empty()) {
    return std::vector<std::string>(config.hostnames.begin() + s * hosts,
                                    config.hostnames.begin() + (s + 1) * hosts);
  }
  std::vector<std::string> out;
  if (config.num_slices == 1) return out;
  for (int h = 0; h < hosts; ++h) out.push_back(absl::StrCat("127.0.", s + 1, ".", h + 1));
  return out;
}

// What GKE + the KubeRay TPU webhook give global rank `rank` of a job of
// config.num_slices slices (webhook form: the coordinator without a port,
// MEGASCALE_PORT beside it), with the torchrun variables counting every
// slice. One slice: exactly SliceEnvironment's.
absl::StatusOr<EnvMap> MultiSliceEnvironment(const LaunchConfig& config, int rank,
                                             int restart_count, int master_port) {
  const SliceSpec& spec = config.slice;
  const int n = config.num_slices;
  const int per_slice = spec.num_devices();
  const int s = rank / per_slice;
  SliceEnvOptions options;
  options.hostnames = SliceHostnames(config, s);
  options.master_addr = config.master_addr;
  options.master_port = master_port;
  options.job_id = config.job_id;
  options.restart_count = restart_count;
  if (!spec.slice_name.empty()) options.slice_name = spec.slice_name;
  if (n == 1) return SliceEnvironment(spec, rank, options);

  SliceSpec own = spec;  // each slice its own TPU_NAME, as KubeRay's replicas
  own.slice_name.clear();
  options.slice_name = spec.slice_name.empty() ? absl::StrCat("tpu-slice-", s)
                                               : absl::StrCat(spec.slice_name, "-", s);
  const std::string coordinator = SliceHostnames(config, 0)[0];
  if (options.master_addr.empty()) options.master_addr = coordinator;
  absl::StatusOr<EnvMap> env = SliceEnvironment(own, rank % per_slice, options);
  if (!env.ok()) return env.status();
  const int host = rank / spec.devices_per_host;  // job-wide, slice-major
  (*env)["RANK"] = absl::StrCat(rank);
  (*env)["WORLD_SIZE"] = absl::StrCat(per_slice * n);
  (*env)["GROUP_RANK"] = absl::StrCat(host);
  (*env)["NODE_RANK"] = absl::StrCat(host);
  (*env)["GROUP_WORLD_SIZE"] = absl::StrCat(spec.num_hosts * n);
  (*env)["MEGASCALE_NUM_SLICES"] = absl::StrCat(n);
  (*env)["MEGASCALE_SLICE_ID"] = absl::StrCat(s);
  (*env)["MEGASCALE_COORDINATOR_ADDRESS"] = coordinator;
  (*env)["MEGASCALE_PORT"] = absl::StrCat(config.megascale_port);
  return env;
}

}  // namespace

absl::Status ValidateLaunchConfig(const LaunchConfig& config) {
  if (config.command.empty() || config.command[0].empty()) {
    return absl::InvalidArgumentError("no command given: expected `tpurun [flags] -- binary args`");
  }
  if (config.job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  if (!config.job_secret_hex.empty() && !config.job_secret_file.empty()) {
    return absl::InvalidArgumentError("both job_secret_hex and job_secret_file are set");
  }
  if (config.mode == LaunchConfig::Mode::kPlain) {
    if (config.nproc < 1 || config.nproc > kMaxLocalRanks) {
      return absl::InvalidArgumentError(absl::StrCat("nproc=", config.nproc, "; expected 1 <= nproc <= ",
                                                     kMaxLocalRanks, " (processes one tpurun starts)"));
    }
    return absl::OkStatus();
  }
  const SliceSpec& s = config.slice;
  if (s.num_hosts < 1 || s.devices_per_host < 1) {
    return absl::InvalidArgumentError(absl::StrCat("slice with num_hosts=", s.num_hosts,
                                                   " devices_per_host=", s.devices_per_host,
                                                   "; expected a spec from SliceSpecFromFlags"));
  }
  if (config.num_slices < 1 || config.num_slices > kMaxEmulatedSlices) {
    return absl::InvalidArgumentError(absl::StrCat("--num-slices=", config.num_slices,
                                                   ": expected 1..", kMaxEmulatedSlices));
  }
  if (config.num_slices > 1 && !config.hosts_emulated) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num-slices=", config.num_slices,
        " without --hosts-emulated: only emulated slices are supported (one tpurun per real "
        "host of a multi-slice job is not)"));
  }
  if (config.num_slices > 1 && s.num_devices() * config.num_slices > kMaxLocalRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num-slices=", config.num_slices, " of ", s.num_devices(), " devices: ",
        s.num_devices() * config.num_slices, " ranks; expected at most ", kMaxLocalRanks,
        " ranks on one machine"));
  }
  if (config.num_slices > 1 && config.hostnames.empty() && s.num_hosts > 254) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num-slices=", config.num_slices, " of ", s.num_hosts,
        " hosts: an emulated slice's hosts must fit in 127.0.<s+1>.1..254"));
  }
  if (config.num_slices > 1 && (config.megascale_port < 1 || config.megascale_port > 65535)) {
    return absl::InvalidArgumentError(
        absl::StrCat("megascale_port=", config.megascale_port, "; expected 1..65535"));
  }
  if (config.hosts_emulated && s.num_devices() > kMaxLocalRanks) {
    return absl::InvalidArgumentError(absl::StrCat("--hosts-emulated with ", s.num_devices(),
                                                   " devices; expected at most ", kMaxLocalRanks,
                                                   " ranks on one machine"));
  }
  if (!config.hosts_emulated && (config.host_index < 0 || config.host_index >= s.num_hosts)) {
    return absl::InvalidArgumentError(absl::StrCat("host_index=", config.host_index,
                                                   "; expected 0 <= host_index < ", s.num_hosts,
                                                   " (the slice's hosts)"));
  }
  const int all_hosts = s.num_hosts * config.num_slices;
  if (!config.hostnames.empty() && static_cast<int>(config.hostnames.size()) != all_hosts) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.hostnames.size(), " hostnames given (", absl::StrJoin(config.hostnames, ","),
        "); expected one per host, ", all_hosts,
        config.num_slices > 1 ? absl::StrCat(" (", config.num_slices, " slices x ", s.num_hosts,
                                             ", slice-major)")
                              : std::string()));
  }
  return absl::OkStatus();
}

bool MayPickMasterPort(const LaunchConfig& config) {
  return config.mode == LaunchConfig::Mode::kPlain || config.hosts_emulated ||
         config.slice.num_hosts == 1;
}

absl::StatusOr<std::vector<ProcessSpec>> PlanRanks(const LaunchConfig& config, int restart_count,
                                                   int master_port) {
  if (absl::Status s = ValidateLaunchConfig(config); !s.ok()) return s;
  const LocalRange range = LocalRanks(config);
  std::vector<ProcessSpec> specs;
  specs.reserve(range.count);
  for (int rank = range.first; rank < range.first + range.count; ++rank) {
    ProcessSpec spec;
    spec.rank = rank;
    spec.argv = config.command;
    int world, host, local;
    if (config.mode == LaunchConfig::Mode::kSlice) {
      absl::StatusOr<EnvMap> env = MultiSliceEnvironment(config, rank, restart_count, master_port);
      if (!env.ok()) return env.status();
      spec.env = *std::move(env);
      const int per_slice = config.slice.num_devices();
      world = per_slice * config.num_slices;
      host = rank / config.slice.devices_per_host;
      local = rank % config.slice.devices_per_host;
      if (config.num_slices > 1) {
        spec.description = absl::StrCat("rank ", rank, " (slice ", rank / per_slice, " host ",
                                        (rank % per_slice) / config.slice.devices_per_host,
                                        ", local ", local, ")");
      }
    } else {
      world = config.nproc;
      host = 0;
      local = rank;
      EnvMap& env = spec.env;
      env["RANK"] = absl::StrCat(rank);
      env["LOCAL_RANK"] = absl::StrCat(rank);
      env["WORLD_SIZE"] = absl::StrCat(world);
      env["LOCAL_WORLD_SIZE"] = absl::StrCat(world);
      env["GROUP_RANK"] = "0";
      env["GROUP_WORLD_SIZE"] = "1";
      env["MASTER_ADDR"] = config.master_addr.empty() ? "127.0.0.1" : config.master_addr;
      env["MASTER_PORT"] = absl::StrCat(master_port);
      env["TORCHELASTIC_RESTART_COUNT"] = absl::StrCat(restart_count);
    }
    AddElasticVariables(config, rank, world, &spec.env);
    if (spec.description.empty()) {
      spec.description = absl::StrCat("rank ", rank, " (host ", host, ", local ", local, ")");
    }
    spec.output_prefix = RankLabel(rank, world);
    specs.push_back(std::move(spec));
  }
  return specs;
}

bool IsOneOfManyHosts(const LaunchConfig& config) {
  return config.mode == LaunchConfig::Mode::kSlice && !config.hosts_emulated &&
         config.slice.num_hosts > 1;
}

absl::Status ValidateMaxRestarts(const LaunchConfig& config, int max_restarts) {
  if (max_restarts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-restarts=", max_restarts, ": expected a number >= 0"));
  }
  if (max_restarts > 0 && IsOneOfManyHosts(config)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-restarts=", max_restarts, " with one tpurun per host (host ", config.host_index,
        " of ", config.slice.num_hosts,
        "): not supported yet. Each host's tpurun sees only its own ranks and the hosts do not "
        "agree on a restart, so a restart here would meet the other hosts' stopped ranks and "
        "fail. Restart the whole job from outside (your scheduler, a loop over every host's "
        "tpurun), or use tpu_dist-ray-run, or --hosts-emulated on one machine"));
  }
  return absl::OkStatus();
}

std::string PeerFailureHint(const LaunchConfig& config) {
  if (!IsOneOfManyHosts(config)) return "";
  const SliceSpec& s = config.slice;
  const int first = config.host_index * s.devices_per_host;
  std::string others;
  int listed = 0;
  for (int h = 0; h < s.num_hosts; ++h) {
    if (h == config.host_index) continue;
    if (++listed > 8) {
      absl::StrAppend(&others, ", ...");
      break;
    }
    const std::string address = config.hostnames.empty() ? absl::StrCat("127.0.1.", h + 1)
                                                         : config.hostnames[h];
    absl::StrAppend(&others, others.empty() ? "" : ", ", h, " (", address, ")");
  }
  return absl::StrCat("the rank that failed is on another host (this tpurun runs host ",
                      config.host_index, " of ", s.num_hosts, ", ranks ", first, "-",
                      first + s.devices_per_host - 1, "): see the tpurun of host",
                      s.num_hosts > 2 ? "s " : " ", others);
}

std::vector<std::string> LostSliceLines(const LaunchConfig& config,
                                        const std::vector<int>& failed_ranks) {
  std::vector<std::string> lines;
  if (config.mode != LaunchConfig::Mode::kSlice || config.num_slices <= 1) return lines;
  const int per_slice = config.slice.num_devices();
  for (int s = 0; s < config.num_slices; ++s) {
    int failed = 0;
    for (int rank : failed_ranks) failed += rank / per_slice == s ? 1 : 0;
    if (failed < per_slice) continue;
    const std::vector<std::string> hosts = SliceHostnames(config, s);
    std::string host_text = hosts.size() == 1 ? absl::StrCat("host ", hosts.front())
                                              : absl::StrCat("hosts ", hosts.front(), "-", hosts.back());
    lines.push_back(absl::StrCat("slice ", s, " (ranks ", s * per_slice, "-", (s + 1) * per_slice - 1,
                                 ", ", host_text, ") lost: all ", per_slice,
                                 " of its ranks failed before tpurun stopped the job"));
  }
  return lines;
}

std::string StartBanner(const LaunchConfig& config) {
  if (config.mode == LaunchConfig::Mode::kPlain) {
    return absl::StrCat(config.nproc, config.nproc == 1 ? " process" : " processes",
                        " (plain), job ", config.job_id);
  }
  const SliceSpec& s = config.slice;
  std::string where = config.hosts_emulated
                          ? "emulated"
                          : absl::StrCat("host ", config.host_index, " of ", s.num_hosts);
  const int n = config.num_slices;
  const int hosts = s.num_hosts * n;
  return absl::StrCat(s.accelerator_type, " ", absl::StrJoin(s.chip_topology, "x"),
                      n > 1 ? absl::StrCat(" x ", n, " slices") : std::string(), ", ",
                      s.num_devices() * n, " devices on ", hosts,
                      hosts == 1 ? " host x " : " hosts x ", s.devices_per_host, " (", where,
                      "), job ", config.job_id);
}

std::string GenerateJobId() {
  uint64_t now = static_cast<uint64_t>(absl::ToUnixMicros(absl::Now()));
  return absl::StrCat("tpurun-", getpid(), "-", absl::Hex(now & 0xffffffffffULL));
}

}  // namespace tpudist::tpu_runtime::launcher
