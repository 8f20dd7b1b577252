// Fuzz target: tpu_runtime's environment discovery and topology parsing
// (env_discovery.h, tpu_env.h, launcher_env.h, env_parse.h, topology.h,
// slice_env.h): everything a rank reads from the variables its launcher set.
//
// Input: an environment as text, one NAME=VALUE per line (fuzz/
// env_discovery_fuzzer.dict lists the variable names discovery reads). Then:
//   1. DiscoverRankInfo(env): an error is InvalidArgument; a RankInfo is
//      self-consistent (ranks inside their worlds, one hostname per host and
//      one slicebuilder address per rank when known, world = devices of the
//      slice on a TPU);
//   2. every value also goes through each topology / list / host:port parser
//      directly, and what parses must format back to itself;
//   3. TPU_ACCELERATOR_TYPE x TPU_TOPOLOGY as tpurun's flags: the environment
//      SliceEnvironment builds for a rank must discover that rank
//      (slice_env.h's contract).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"
#include "tpu_runtime/env_discovery.h"
#include "tpu_runtime/env_parse.h"
#include "tpu_runtime/slice_env.h"
#include "tpu_runtime/topology.h"

namespace {

namespace rt = tpudist::tpu_runtime;

// Slices above this many devices are parsed but not round-tripped through
// SliceEnvironment (which writes one slicebuilder address per device).
constexpr int kMaxRoundTripDevices = 4096;

void CheckRankInfo(const rt::RankInfo& info) {
  const std::string s = rt::ToString(info);
  FUZZ_CHECK(info.world_size >= 1 && info.rank >= 0 && info.rank < info.world_size, "%s", s.c_str());
  FUZZ_CHECK(info.local_world_size >= 1 && info.local_rank >= 0 && info.local_rank < info.local_world_size, "%s",
             s.c_str());
  FUZZ_CHECK(info.num_hosts >= 1 && info.host_index >= 0 && info.host_index < info.num_hosts, "%s", s.c_str());
  FUZZ_CHECK(info.master_port >= 1 && info.master_port <= 65535, "%s port %d", s.c_str(), info.master_port);
  FUZZ_CHECK(info.num_slices >= 1 && info.slice_index >= 0 && info.slice_index < info.num_slices &&
                 info.world_size % info.num_slices == 0 && info.num_hosts % info.num_slices == 0 &&
                 info.rank / info.devices_per_slice() == info.slice_index &&
                 info.host_index / info.hosts_per_slice() == info.slice_index,
             "%s", s.c_str());
  FUZZ_CHECK(info.hostnames.empty() || static_cast<int>(info.hostnames.size()) == info.hosts_per_slice(),
             "%s with %zu hostnames", s.c_str(), info.hostnames.size());
  FUZZ_CHECK(info.slicebuilder_addresses.empty() ||
                 static_cast<int>(info.slicebuilder_addresses.size()) == info.devices_per_slice(),
             "%s with %zu slicebuilder addresses", s.c_str(), info.slicebuilder_addresses.size());
  FUZZ_CHECK(!info.master_addr.empty() && !info.job_id.empty(), "%s", s.c_str());
  if (info.source == rt::DiscoverySource::kKubeRayTpu || info.source == rt::DiscoverySource::kTorchTpu) {
    FUZZ_CHECK(info.devices_per_slice() == info.slice.num_devices(), "%s: slice of %d devices", s.c_str(),
               info.slice.num_devices());
  }
  (void)info.slicebuilder_address();
}

// Each parser on one value; what parses formats back to itself.
void ParseValue(const std::string& value) {
  if (auto dims = rt::ParseChipTopology("V", value); dims.ok()) {
    FUZZ_CHECK(rt::Product(*dims) <= rt::kMaxTopologyElements, "%s", value.c_str());
    auto again = rt::ParseChipTopology("V", rt::FormatChipTopology(*dims));
    FUZZ_CHECK(again.ok() && *again == *dims, "chip topology %s does not round-trip", value.c_str());
    for (const char* gen : {"v4", "v5e", "v5p", "v6e", "tpu7x"}) {
      if (auto spec = rt::MakeSliceSpec("V", gen, *dims, 1, "s"); spec.ok()) {
        FUZZ_CHECK(spec->num_devices() == rt::Product(*dims), "%s on %s", value.c_str(), gen);
      }
    }
  }
  if (auto dims = rt::ParseProcessTopology("V", value); dims.ok()) {
    auto again = rt::ParseProcessTopology("V", rt::FormatProcessTopology(*dims));
    FUZZ_CHECK(again.ok() && *again == *dims, "process topology %s does not round-trip", value.c_str());
    for (const char* gen : {"v6e", "tpu7x"}) (void)rt::ChipLayoutFromProcessTopology("V", *dims, gen);
  }
  if (auto type = rt::ParseAcceleratorType("V", value); type.ok()) {
    (void)rt::HasThreeDimTopology(type->generation);
    (void)rt::ChipletsPerChip(type->generation, "");
  }
  (void)rt::ParseCommaList("V", value);
  (void)rt::ParseHostPort("V", value);
  (void)rt::ParseInt("V", value, -5, 1 << 20);
}

void RoundTripFlags(const rt::EnvMap& env) {
  const std::string accelerator = rt::GetEnv(env, "TPU_ACCELERATOR_TYPE").value_or("");
  const std::string topology = rt::GetEnv(env, "TPU_TOPOLOGY").value_or("");
  absl::StatusOr<rt::SliceSpec> spec = rt::SliceSpecFromFlags(accelerator, topology);
  if (!spec.ok() || spec->num_devices() > kMaxRoundTripDevices) return;
  int rank = 0;
  if (auto r = rt::GetEnv(env, "RANK"); r && absl::SimpleAtoi(*r, &rank)) {
    rank = rank < 0 ? 0 : rank % spec->num_devices();
  }
  for (int r : {0, rank, spec->num_devices() - 1}) {
    absl::StatusOr<rt::EnvMap> slice_env = rt::SliceEnvironment(*spec, r, {});
    if (!slice_env.ok()) continue;
    absl::StatusOr<rt::RankInfo> info = rt::DiscoverRankInfo(*slice_env);
    FUZZ_CHECK(info.ok(), "%s x %s rank %d: %s", accelerator.c_str(), topology.c_str(), r,
               info.status().ToString().c_str());
    CheckRankInfo(*info);
    FUZZ_CHECK(info->rank == r && info->world_size == spec->num_devices() &&
                   info->slice.chip_topology == spec->chip_topology &&
                   info->slice.devices_per_host == spec->devices_per_host,
               "%s x %s rank %d discovered as %s", accelerator.c_str(), topology.c_str(), r,
               rt::ToString(*info).c_str());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tpudist::fuzz::FuzzInput in(data, size);
  rt::EnvMap env;
  while (!in.empty()) {
    const std::string line = in.Until('\n');
    const size_t eq = line.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  absl::StatusOr<rt::RankInfo> info = rt::DiscoverRankInfo(env);
  if (info.ok()) {
    CheckRankInfo(*info);
  } else {
    FUZZ_CHECK(info.status().code() == absl::StatusCode::kInvalidArgument, "%s",
               info.status().ToString().c_str());
  }
  for (const auto& [name, value] : env) ParseValue(value);
  RoundTripFlags(env);
  return 0;
}
