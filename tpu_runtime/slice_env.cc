#include "tpu_runtime/slice_env.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tpu_runtime/topology.h"
#include "tpu_runtime/tpu_env.h"

namespace tpudist::tpu_runtime {
namespace {

constexpr int kMaxPort = 65535;

// The Cloud TPU style accelerator type GKE exposes as TPU_ACCELERATOR_TYPE:
// "<generation>-<count>", counting chips on v5e ("v5litepod-N") and v6e, and
// TensorCores (2 per chip) on v4, v5p and tpu7x.
std::string CloudAcceleratorType(const SliceSpec& spec) {
  const int chips = Product(spec.chip_topology);
  if (spec.accelerator_type == "v5e") return absl::StrCat("v5litepod-", chips);
  if (spec.accelerator_type == "v6e") return absl::StrCat("v6e-", chips);
  return absl::StrCat(spec.accelerator_type, "-", 2 * chips);
}

absl::Status ValidateSpec(const SliceSpec& spec, int rank, const SliceEnvOptions& options) {
  if (spec.accelerator_type == "cpu" || spec.chip_topology.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SliceEnvironment: accelerator_type=\"", spec.accelerator_type,
                     "\" with no chip topology; expected a TPU SliceSpec from "
                     "SliceSpecFromFlags"));
  }
  if (spec.num_hosts < 1 || spec.devices_per_host < 1 || spec.chiplets_per_chip < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("SliceEnvironment: num_hosts=", spec.num_hosts,
                     " devices_per_host=", spec.devices_per_host, " chiplets_per_chip=",
                     spec.chiplets_per_chip, "; expected all >= 1"));
  }
  if (rank < 0 || rank >= spec.num_devices()) {
    return absl::InvalidArgumentError(absl::StrCat("SliceEnvironment: rank=", rank,
                                                   "; expected 0 <= rank < ",
                                                   spec.num_devices()));
  }
  if (!options.hostnames.empty() &&
      static_cast<int>(options.hostnames.size()) != spec.num_hosts) {
    return absl::InvalidArgumentError(
        absl::StrCat("SliceEnvironment: ", options.hostnames.size(),
                     " hostnames given; expected one per host, ", spec.num_hosts));
  }
  for (const std::string& host : options.hostnames) {
    if (host.empty() || absl::StrContains(host, ",") || absl::StrContains(host, ":")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SliceEnvironment: hostname \"", host, "\"; expected a non-empty name without ',' or ':'"));
    }
  }
  if (spec.num_hosts > 254 && options.hostnames.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SliceEnvironment: ", spec.num_hosts,
        " hosts do not fit in 127.0.1.1..127.0.1.254; pass options.hostnames"));
  }
  if (options.master_port < 1 || options.master_port > kMaxPort) {
    return absl::InvalidArgumentError(absl::StrCat("SliceEnvironment: master_port=",
                                                   options.master_port,
                                                   "; expected 1..65535"));
  }
  if (options.slicebuilder_base_port < 1 ||
      options.slicebuilder_base_port + spec.devices_per_host - 1 > kMaxPort) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SliceEnvironment: slicebuilder_base_port=", options.slicebuilder_base_port,
        "; expected base + devices_per_host - 1 <= 65535"));
  }
  if (options.restart_count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SliceEnvironment: restart_count=", options.restart_count, "; expected >= 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SliceSpec> SliceSpecFromFlags(absl::string_view accelerator_type,
                                             absl::string_view topology) {
  absl::StatusOr<AcceleratorType> accel = ParseAcceleratorType("accelerator_type",
                                                               accelerator_type);
  if (!accel.ok()) return accel.status();
  const std::string& gen = accel->generation;
  ChipLayout layout;
  if (absl::StrContains(topology, ',')) {
    // Given in process units, like TORCH_TPU_TOPOLOGY.
    absl::StatusOr<std::vector<int>> dims = ParseProcessTopology("topology", topology);
    if (!dims.ok()) return dims.status();
    absl::StatusOr<ChipLayout> l = ChipLayoutFromProcessTopology("topology", *dims, gen);
    if (!l.ok()) return l.status();
    layout = *std::move(l);
    absl::StatusOr<int> allowed = ChipletsPerChip(gen, absl::StrCat(layout.chiplets_per_chip));
    if (!allowed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "topology=\"", topology, "\": a 4th dimension of ", layout.chiplets_per_chip,
          " chiplets per chip; expected 2 only on tpu7x"));
    }
  } else {
    absl::StatusOr<std::vector<int>> dims = ParseChipTopology("topology", topology);
    if (!dims.ok()) return dims.status();
    layout.chip_dims = *std::move(dims);
    absl::StatusOr<int> chiplets = ChipletsPerChip(gen, "");
    if (!chiplets.ok()) return chiplets.status();
    layout.chiplets_per_chip = *chiplets;
  }
  return MakeSliceSpec("topology", gen, layout.chip_dims, layout.chiplets_per_chip, "");
}

absl::StatusOr<EnvMap> SliceEnvironment(const SliceSpec& spec, int rank,
                                        const SliceEnvOptions& options) {
  if (absl::Status s = ValidateSpec(spec, rank, options); !s.ok()) return s;
  std::vector<std::string> hosts = options.hostnames;
  for (int h = 0; hosts.size() < static_cast<size_t>(spec.num_hosts); ++h) {
    hosts.push_back(absl::StrCat("127.0.1.", h + 1));
  }
  const int per_host = spec.devices_per_host;
  const int host = rank / per_host;
  const int local = rank % per_host;
  const std::vector<std::string> slicebuilder =
      DefaultSlicebuilderAddresses(hosts, per_host, options.slicebuilder_base_port);
  const std::string master = options.master_addr.empty() ? hosts[0] : options.master_addr;

  EnvMap env;
  // KubeRay TPU webhook.
  env["TPU_WORKER_ID"] = absl::StrCat(host);
  env["TPU_WORKER_HOSTNAMES"] = absl::StrJoin(hosts, ",");
  env["TPU_NAME"] = spec.slice_name.empty() ? options.slice_name : spec.slice_name;
  // GKE.
  env["TPU_ACCELERATOR_TYPE"] = CloudAcceleratorType(spec);
  env["TPU_TOPOLOGY"] = FormatChipTopology(spec.chip_topology);
  // Also on a tpu7x slice run one device per chip (--topology=4,4,1): without
  // it discovery assumes tpu7x's 2 and rejects TORCH_TPU_TOPOLOGY (fuzz/).
  if (spec.chiplets_per_chip > 1 || spec.accelerator_type == "tpu7x") {
    env["RAY_TPU_RESOURCE_PER_CHIP"] = absl::StrCat(spec.chiplets_per_chip);
  }
  // TorchTPU.
  env["TORCH_TPU_TOPOLOGY"] = FormatProcessTopology(spec.process_topology);
  env["TORCH_TPU_SLICEBUILDER_ADDRESSES"] = absl::StrJoin(slicebuilder, ",");
  env["TPU_VISIBLE_CHIPS"] = absl::StrCat(local);
  // torchrun / Ray Train.
  env["MASTER_ADDR"] = master;
  env["MASTER_PORT"] = absl::StrCat(options.master_port);
  env["RANK"] = absl::StrCat(rank);
  env["WORLD_SIZE"] = absl::StrCat(spec.num_devices());
  env["LOCAL_RANK"] = absl::StrCat(local);
  env["LOCAL_WORLD_SIZE"] = absl::StrCat(per_host);
  env["GROUP_RANK"] = absl::StrCat(host);
  env["NODE_RANK"] = absl::StrCat(host);
  env["GROUP_WORLD_SIZE"] = absl::StrCat(spec.num_hosts);
  env["TORCHELASTIC_RESTART_COUNT"] = absl::StrCat(options.restart_count);
  // tpu_dist.
  env["TPU_DIST_HOST_ID"] = hosts[host];
  if (!options.job_id.empty()) env["TPU_DIST_JOB_ID"] = options.job_id;
  return env;
}

}  // namespace tpudist::tpu_runtime
