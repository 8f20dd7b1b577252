#include "tpu_runtime/tpu_env.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tpu_runtime/env_parse.h"
#include "tpu_runtime/topology.h"

namespace tpudist::tpu_runtime {
namespace {

constexpr const char* kSizingVars[] = {"TPU_TOPOLOGY", "TORCH_TPU_TOPOLOGY", "TPU_WORKER_ID",
                                       "TPU_WORKER_HOSTNAMES",
                                       "TORCH_TPU_SLICEBUILDER_ADDRESSES"};

// The slice and a sentence saying where its host layout came from.
struct SizedSlice {
  SliceSpec spec;
  std::string why;  // e.g. "16 chips of TPU_TOPOLOGY=\"4x4\" on v6e / 4 chips per host"
};

// Host count for a slice of unknown generation: hostnames, else distinct
// slicebuilder hosts, else devices / LOCAL_WORLD_SIZE, else 1.
std::pair<int, std::string> HostCountHint(const std::vector<std::string>& hostnames,
                                          const std::vector<HostPort>& slicebuilder, int devices,
                                          std::optional<int> local_world_size) {
  if (!hostnames.empty()) {
    return {static_cast<int>(hostnames.size()), "the TPU_WORKER_HOSTNAMES count"};
  }
  if (!slicebuilder.empty()) {
    std::set<std::string> hosts;
    for (const HostPort& hp : slicebuilder) hosts.insert(hp.host);
    return {static_cast<int>(hosts.size()), "the TORCH_TPU_SLICEBUILDER_ADDRESSES hosts"};
  }
  if (local_world_size && *local_world_size > 0 && devices % *local_world_size == 0) {
    return {devices / *local_world_size, "devices / LOCAL_WORLD_SIZE"};
  }
  return {1, "no host list (one host)"};
}

absl::StatusOr<SizedSlice> SizeSlice(const EnvMap& env, const std::vector<std::string>& hostnames,
                                     const std::vector<HostPort>& slicebuilder,
                                     std::optional<int> local_world_size) {
  std::optional<AcceleratorType> accel;
  if (std::optional<std::string> v = GetEnv(env, "TPU_ACCELERATOR_TYPE")) {
    absl::StatusOr<AcceleratorType> a = ParseAcceleratorType("TPU_ACCELERATOR_TYPE", *v);
    if (!a.ok()) return a.status();
    accel = *a;
  }
  const std::string name = GetEnv(env, "TPU_NAME").value_or("");
  const std::string per_chip = GetEnv(env, "RAY_TPU_RESOURCE_PER_CHIP").value_or("");
  std::optional<std::vector<int>> proc;
  if (std::optional<std::string> v = GetEnv(env, "TORCH_TPU_TOPOLOGY")) {
    absl::StatusOr<std::vector<int>> p = ParseProcessTopology("TORCH_TPU_TOPOLOGY", *v);
    if (!p.ok()) return p.status();
    proc = *p;
  }
  SizedSlice out;
  if (std::optional<std::string> topo = GetEnv(env, "TPU_TOPOLOGY")) {
    absl::StatusOr<std::vector<int>> chips = ParseChipTopology("TPU_TOPOLOGY", *topo);
    if (!chips.ok()) return chips.status();
    if (!accel) {
      return EnvError("TPU_TOPOLOGY", *topo,
                      "expected TPU_ACCELERATOR_TYPE to be set too (GKE sets both); without "
                      "it the chips per host are unknown");
    }
    absl::StatusOr<int> chiplets = ChipletsPerChip(accel->generation, per_chip);
    if (!chiplets.ok()) return chiplets.status();
    absl::StatusOr<SliceSpec> spec =
        MakeSliceSpec("TPU_TOPOLOGY", accel->generation, *chips, *chiplets, name);
    if (!spec.ok()) return spec.status();
    if (proc && *proc != spec->process_topology) {
      return EnvError("TORCH_TPU_TOPOLOGY", FormatProcessTopology(*proc),
                      absl::StrCat("expected \"", FormatProcessTopology(spec->process_topology),
                                   "\", the process units of TPU_TOPOLOGY=\"", *topo, "\" on ",
                                   accel->generation, " with ", *chiplets,
                                   " device(s) per chip"));
    }
    out.spec = *std::move(spec);
    out.why = absl::StrCat(Product(*chips), " chips of TPU_TOPOLOGY=\"", *topo, "\" on ",
                           accel->generation, " / ",
                           ChipsPerHost(accel->generation, *chips), " chips per host");
    return out;
  }
  if (proc && accel) {
    const std::string value = FormatProcessTopology(*proc);
    absl::StatusOr<ChipLayout> layout =
        ChipLayoutFromProcessTopology("TORCH_TPU_TOPOLOGY", *proc, accel->generation);
    if (!layout.ok()) return layout.status();
    absl::StatusOr<int> chiplets = ChipletsPerChip(accel->generation, per_chip);
    if (!chiplets.ok()) return chiplets.status();
    if (*chiplets != layout->chiplets_per_chip) {
      return EnvError("TORCH_TPU_TOPOLOGY", value,
                      absl::StrCat("expected ", *chiplets, " device(s) per chip on ",
                                   accel->generation,
                                   per_chip.empty() ? "" : " (RAY_TPU_RESOURCE_PER_CHIP)"));
    }
    absl::StatusOr<SliceSpec> spec = MakeSliceSpec("TORCH_TPU_TOPOLOGY", accel->generation,
                                                   layout->chip_dims, *chiplets, name);
    if (!spec.ok()) return spec.status();
    out.spec = *std::move(spec);
    out.why = absl::StrCat("TORCH_TPU_TOPOLOGY=\"", value, "\" on ", accel->generation);
    return out;
  }
  if (proc) {
    const int devices = Product(*proc);
    auto [hosts, why] = HostCountHint(hostnames, slicebuilder, devices, local_world_size);
    if (devices % hosts != 0) {
      return EnvError("TORCH_TPU_TOPOLOGY", FormatProcessTopology(*proc),
                      absl::StrCat("expected a device count divisible by ", hosts,
                                   " hosts (from ", why, ")"));
    }
    out.spec.accelerator_type = "tpu";
    out.spec.chip_topology.assign(proc->begin(), proc->begin() + 3);
    out.spec.chiplets_per_chip = proc->size() == 4 ? (*proc)[3] : 1;
    out.spec.process_topology = *proc;
    out.spec.num_hosts = hosts;
    out.spec.devices_per_host = devices / hosts;
    out.spec.slice_name = name;
    out.why = absl::StrCat(devices, " devices of TORCH_TPU_TOPOLOGY / ", hosts, " hosts from ",
                           why);
    return out;
  }
  for (const char* var : kSizingVars) {
    if (std::optional<std::string> v = GetEnv(env, var)) {
      return EnvError(var, *v,
                      "expected a slice topology too: TPU_TOPOLOGY with TPU_ACCELERATOR_TYPE "
                      "(GKE), or TORCH_TPU_TOPOLOGY");
    }
  }
  return absl::InternalError("SizeSlice called without TPU variables");
}

}  // namespace

bool HasTpuEnv(const EnvMap& env) {
  for (const char* var : kSizingVars) {
    if (HasEnv(env, var)) return true;
  }
  return false;
}

std::vector<std::string> DefaultSlicebuilderAddresses(const std::vector<std::string>& hostnames,
                                                      int devices_per_host, int base_port) {
  std::vector<std::string> out;
  out.reserve(hostnames.size() * devices_per_host);
  for (const std::string& host : hostnames) {
    for (int l = 0; l < devices_per_host; ++l) out.push_back(absl::StrCat(host, ":", base_port + l));
  }
  return out;
}

absl::StatusOr<std::optional<TpuEnv>> ReadTpuEnv(const EnvMap& env,
                                                  std::optional<int> local_world_size_hint) {
  if (!HasTpuEnv(env)) return std::optional<TpuEnv>();
  TpuEnv out;
  if (std::optional<std::string> v = GetEnv(env, "TPU_WORKER_HOSTNAMES")) {
    absl::StatusOr<std::vector<std::string>> hosts = ParseCommaList("TPU_WORKER_HOSTNAMES", *v);
    if (!hosts.ok()) return hosts.status();
    out.hostnames = *std::move(hosts);
  }
  std::vector<HostPort> slicebuilder;
  const std::optional<std::string> sb_value = GetEnv(env, "TORCH_TPU_SLICEBUILDER_ADDRESSES");
  if (sb_value) {
    absl::StatusOr<std::vector<std::string>> list =
        ParseCommaList("TORCH_TPU_SLICEBUILDER_ADDRESSES", *sb_value);
    if (!list.ok()) return list.status();
    for (const std::string& item : *list) {
      absl::StatusOr<HostPort> hp = ParseHostPort("TORCH_TPU_SLICEBUILDER_ADDRESSES", item);
      if (!hp.ok()) return hp.status();
      slicebuilder.push_back(*hp);
    }
    out.slicebuilder_addresses = *std::move(list);
  }
  absl::StatusOr<SizedSlice> sized = SizeSlice(env, out.hostnames, slicebuilder,
                                               local_world_size_hint);
  if (!sized.ok()) return sized.status();
  out.slice = sized->spec;
  out.layout = sized->why;
  out.hostnames_given = !out.hostnames.empty() || !slicebuilder.empty();
  const SliceSpec& s = out.slice;
  if (!out.hostnames.empty() && static_cast<int>(out.hostnames.size()) != s.num_hosts) {
    return EnvError("TPU_WORKER_HOSTNAMES", *GetEnv(env, "TPU_WORKER_HOSTNAMES"),
                    absl::StrCat("expected ", s.num_hosts, " hostnames, one per host (",
                                 sized->why, "), got ", out.hostnames.size()));
  }
  if (sb_value && static_cast<int>(slicebuilder.size()) != s.num_devices()) {
    return EnvError("TORCH_TPU_SLICEBUILDER_ADDRESSES", *sb_value,
                    absl::StrCat("expected ", s.num_devices(), " host:port entries, one per device (",
                                 s.num_hosts, " hosts x ", s.devices_per_host, "), got ",
                                 slicebuilder.size()));
  }
  if (out.hostnames.empty() && !slicebuilder.empty()) {
    for (int h = 0; h < s.num_hosts; ++h) out.hostnames.push_back(slicebuilder[h * s.devices_per_host].host);
  }
  absl::StatusOr<std::optional<int>> worker = GetInt(env, "TPU_WORKER_ID");
  if (!worker.ok()) return worker.status();
  if (*worker && **worker >= s.num_hosts) {
    return EnvError("TPU_WORKER_ID", absl::StrCat(**worker),
                    absl::StrCat("expected 0..", s.num_hosts - 1, ", one of the ", s.num_hosts,
                                 " hosts (", sized->why, ")"));
  }
  out.worker_id = *worker;
  if (std::optional<std::string> v = GetEnv(env, "TPU_VISIBLE_CHIPS")) {
    // A list ("0,1,2,3", Ray's per-task mask) names no single device: ignored.
    if (v->find(',') == std::string::npos) {
      absl::StatusOr<int> chip = ParseInt("TPU_VISIBLE_CHIPS", *v, 0, s.devices_per_host - 1);
      if (!chip.ok()) return chip.status();
      out.visible_chip = *chip;
    }
  }
  const bool kuberay = HasEnv(env, "TPU_WORKER_ID") || HasEnv(env, "TPU_WORKER_HOSTNAMES") ||
                       HasEnv(env, "TPU_TOPOLOGY");
  out.source = kuberay ? DiscoverySource::kKubeRayTpu : DiscoverySource::kTorchTpu;
  return std::optional<TpuEnv>(std::move(out));
}

}  // namespace tpudist::tpu_runtime
