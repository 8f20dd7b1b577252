#include "tpu_runtime/env_discovery.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tpu_runtime/env_parse.h"
#include "tpu_runtime/launcher_env.h"
#include "tpu_runtime/megascale_env.h"
#include "tpu_runtime/tpu_env.h"

extern char** environ;

namespace tpudist::tpu_runtime {
namespace {

constexpr int kDefaultMasterPort = 29500;

// Rank fields of RankInfo, before names and addresses.
struct Placement {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int host_index = 0;
  int num_hosts = 1;
};

// `var` (holding `value`) must equal `want`; `why` explains `want`.
absl::Status Expect(const NamedInt& got, int want, absl::string_view why) {
  if (got.value == want) return absl::OkStatus();
  return EnvError(got.var, absl::StrCat(got.value), absl::StrCat("expected ", want, ", ", why));
}

// Placement on a TPU slice, with or without launcher ranks.
// Several slices (`ms`): ranks are slice-major, so rank = slice x devices per
// slice + rank in slice and host = slice x hosts per slice + TPU_WORKER_ID.
absl::StatusOr<Placement> PlaceOnTpu(const TpuEnv& tpu, const std::optional<LauncherRanks>& l,
                                     const MegascaleEnv& ms, const EnvMap& env) {
  const SliceSpec& s = tpu.slice;
  Placement p;
  const int dps = s.num_devices();
  p.world_size = dps * ms.num_slices;
  p.local_world_size = s.devices_per_host;
  p.num_hosts = s.num_hosts * ms.num_slices;
  const int dph = s.devices_per_host;
  const std::string slices =
      ms.num_slices > 1 ? absl::StrCat(ms.num_slices, " slices x ") : std::string();
  const std::string per_host = absl::StrCat(dph, " devices per host");
  std::optional<NamedInt> local_world = l ? l->local_world_size : std::nullopt;
  std::optional<NamedInt> local_rank = l ? l->local_rank : std::nullopt;
  if (!l) {
    absl::StatusOr<std::optional<int>> lws = GetInt(env, "LOCAL_WORLD_SIZE", 1);
    if (!lws.ok()) return lws.status();
    if (*lws) local_world = NamedInt{**lws, "LOCAL_WORLD_SIZE"};
    absl::StatusOr<std::optional<int>> lr = GetInt(env, "LOCAL_RANK", 0);
    if (!lr.ok()) return lr.status();
    if (*lr) local_rank = NamedInt{**lr, "LOCAL_RANK"};
  }
  if (local_world) {
    if (absl::Status st = Expect(*local_world, dph,
                                 absl::StrCat("the devices per host of the TPU slice (",
                                              tpu.layout, ")"));
        !st.ok()) {
      return st;
    }
  }
  if (local_rank && local_rank->value >= dph) {
    return EnvError(local_rank->var, absl::StrCat(local_rank->value),
                    absl::StrCat("expected 0..", dph - 1, " (", per_host, ")"));
  }
  if (l) {
    if (absl::Status st = Expect(l->world_size, p.world_size,
                                 absl::StrCat("the devices of ", slices, "the TPU slice (",
                                              tpu.layout, ")"));
        !st.ok()) {
      return st;
    }
    p.rank = l->rank.value;
    p.host_index = p.rank / dph;
    p.local_rank = p.rank % dph;
    const std::string of_rank = absl::StrCat(l->rank.var, "=", p.rank, " / ", per_host);
    if (ms.num_slices > 1 && p.rank / dps != ms.slice_index) {
      return EnvError("MEGASCALE_SLICE_ID", absl::StrCat(ms.slice_index),
                      absl::StrCat("expected ", p.rank / dps, " = ", l->rank.var, "=", p.rank,
                                   " / ", dps, " devices per slice"));
    }
    const int host_in_slice = p.host_index % s.num_hosts;
    if (tpu.worker_id && *tpu.worker_id != host_in_slice) {
      return EnvError("TPU_WORKER_ID", absl::StrCat(*tpu.worker_id),
                      absl::StrCat("expected ", host_in_slice, " = ", of_rank,
                                   ms.num_slices > 1
                                       ? absl::StrCat(" % ", s.num_hosts, " hosts per slice")
                                       : std::string()));
    }
    if (l->host_index) {
      if (absl::Status st = Expect(*l->host_index, p.host_index, of_rank); !st.ok()) return st;
    }
    if (l->num_hosts) {
      if (absl::Status st = Expect(*l->num_hosts, p.num_hosts,
                                   absl::StrCat("the hosts of ", slices, "the TPU slice (",
                                                tpu.layout, ")"));
          !st.ok()) {
        return st;
      }
    }
    if (local_rank) {
      if (absl::Status st = Expect(*local_rank, p.local_rank,
                                   absl::StrCat(l->rank.var, "=", p.rank, " % ", per_host));
          !st.ok()) {
        return st;
      }
    }
  } else {
    if (tpu.worker_id) {
      p.host_index = *tpu.worker_id;
    } else if (s.num_hosts > 1) {
      return UnsetError("TPU_WORKER_ID",
                      absl::StrCat("expected the host index 0..", s.num_hosts - 1,
                                   " (or RANK) on a slice of ", s.num_hosts, " hosts"));
    }
    if (local_rank) {
      p.local_rank = local_rank->value;
    } else if (tpu.visible_chip) {
      p.local_rank = *tpu.visible_chip;
    } else if (dph > 1) {
      return UnsetError("LOCAL_RANK",
                      absl::StrCat("expected LOCAL_RANK or TPU_VISIBLE_CHIPS to pick one of the ",
                                   per_host, ": TPU_WORKER_ID gives only the host"));
    }
    p.rank = ms.slice_index * dps + p.host_index * dph + p.local_rank;
    p.host_index += ms.slice_index * s.num_hosts;
  }
  if (tpu.visible_chip && *tpu.visible_chip != p.local_rank) {
    return EnvError("TPU_VISIBLE_CHIPS", absl::StrCat(*tpu.visible_chip),
                    absl::StrCat("expected ", p.local_rank,
                                 ", this process's local rank (one device per process)"));
  }
  return p;
}

// Placement from launcher ranks alone (no TPU variables).
absl::StatusOr<Placement> PlaceFromLauncher(const LauncherRanks& l) {
  Placement p;
  p.rank = l.rank.value;
  p.world_size = l.world_size.value;
  if (l.local_world_size) {
    p.local_world_size = l.local_world_size->value;
  } else if (l.num_hosts && p.world_size % l.num_hosts->value == 0) {
    p.local_world_size = p.world_size / l.num_hosts->value;
  }
  if (p.world_size % p.local_world_size != 0) {
    const std::string var = l.local_world_size ? l.local_world_size->var : l.num_hosts->var;
    return EnvError(var, absl::StrCat(l.local_world_size ? p.local_world_size : l.num_hosts->value),
                    absl::StrCat("expected a divisor of ", l.world_size.var, "=", p.world_size,
                                 " (the same number of processes on every host)"));
  }
  p.local_rank = p.rank % p.local_world_size;
  p.host_index = p.rank / p.local_world_size;
  p.num_hosts = p.world_size / p.local_world_size;
  const std::string lws = absl::StrCat(p.local_world_size, " processes per host");
  if (l.local_rank) {
    if (l.local_rank->value >= p.local_world_size) {
      return EnvError(l.local_rank->var, absl::StrCat(l.local_rank->value),
                      absl::StrCat("expected 0..", p.local_world_size - 1, " (", lws, ")"));
    }
    if (absl::Status st = Expect(*l.local_rank, p.local_rank,
                                 absl::StrCat(l.rank.var, "=", p.rank, " % ", lws,
                                              " (ranks are laid out host by host)"));
        !st.ok()) {
      return st;
    }
  }
  if (l.host_index) {
    if (absl::Status st = Expect(*l.host_index, p.host_index,
                                 absl::StrCat(l.rank.var, "=", p.rank, " / ", lws));
        !st.ok()) {
      return st;
    }
  }
  if (l.num_hosts) {
    if (absl::Status st = Expect(*l.num_hosts, p.num_hosts,
                                 absl::StrCat(l.world_size.var, "=", p.world_size, " / ", lws));
        !st.ok()) {
      return st;
    }
  }
  return p;
}

// With several slices and launcher ranks only (torchrun / Ray Train with
// MEGASCALE_*): the world splits into equal slices, slice-major, and no host
// spans two slices.
absl::Status CheckLauncherSlices(const LauncherRanks& l, const MegascaleEnv& ms,
                                 const Placement& p) {
  if (ms.num_slices == 1) return absl::OkStatus();
  if (p.world_size % ms.num_slices != 0) {
    return EnvError(l.world_size.var, absl::StrCat(p.world_size),
                    absl::StrCat("expected a multiple of MEGASCALE_NUM_SLICES=", ms.num_slices,
                                 " (equal slices)"));
  }
  const int dps = p.world_size / ms.num_slices;
  if (dps % p.local_world_size != 0) {
    return EnvError("MEGASCALE_NUM_SLICES", absl::StrCat(ms.num_slices),
                    absl::StrCat("expected whole hosts per slice: ", dps,
                                 " devices per slice is not a multiple of ", p.local_world_size,
                                 " processes per host"));
  }
  if (p.rank / dps != ms.slice_index) {
    return EnvError("MEGASCALE_SLICE_ID", absl::StrCat(ms.slice_index),
                    absl::StrCat("expected ", p.rank / dps, " = ", l.rank.var, "=", p.rank, " / ",
                                 dps, " devices per slice (", l.world_size.var, "=", p.world_size,
                                 " / MEGASCALE_NUM_SLICES=", ms.num_slices, ")"));
  }
  return absl::OkStatus();
}

// Restart count and job id (needs master addr/port already set).
absl::Status FillRunIdentity(const EnvMap& env, RankInfo* info) {
  for (const char* var : {"TPU_DIST_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"}) {
    absl::StatusOr<std::optional<int>> n = GetInt(env, var, 0);
    if (!n.ok()) return n.status();
    if (*n) {
      info->restart_count = **n;
      break;
    }
  }
  std::optional<std::string> run_id = GetEnv(env, "TORCHELASTIC_RUN_ID");
  if (std::optional<std::string> id = GetEnv(env, "TPU_DIST_JOB_ID")) {
    info->job_id = *id;
  } else if (run_id && *run_id != "none") {
    info->job_id = *run_id;
  } else {
    info->job_id = absl::StrCat(info->master_addr, ":", info->master_port);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RankInfo> DiscoverRankInfo(const EnvMap& env) {
  absl::StatusOr<std::optional<LauncherRanks>> launcher = ReadLauncherRanks(env);
  if (!launcher.ok()) return launcher.status();
  std::optional<int> lws_hint;
  if (*launcher && (*launcher)->local_world_size) lws_hint = (*launcher)->local_world_size->value;
  if (!*launcher) {
    absl::StatusOr<std::optional<int>> lws = GetInt(env, "LOCAL_WORLD_SIZE", 1);
    if (!lws.ok()) return lws.status();
    lws_hint = *lws;
  }
  absl::StatusOr<std::optional<TpuEnv>> tpu = ReadTpuEnv(env, lws_hint);
  if (!tpu.ok()) return tpu.status();

  absl::StatusOr<std::optional<MegascaleEnv>> megascale = ReadMegascaleEnv(env);
  if (!megascale.ok()) return megascale.status();
  const MegascaleEnv ms = megascale->value_or(MegascaleEnv());

  RankInfo info;
  absl::StatusOr<Placement> placed = Placement();
  if (*tpu) {
    placed = PlaceOnTpu(**tpu, *launcher, ms, env);
    info.slice = (*tpu)->slice;
    info.source = (*tpu)->source;
    info.hostnames = (*tpu)->hostnames;
  } else if (*launcher) {
    placed = PlaceFromLauncher(**launcher);
    if (placed.ok()) {
      if (absl::Status st = CheckLauncherSlices(**launcher, ms, *placed); !st.ok()) return st;
    }
    info.slice.accelerator_type = "cpu";
    info.source = (*launcher)->source;
  } else {
    info.slice.accelerator_type = "cpu";
  }
  if (!placed.ok()) return placed.status();
  info.rank = placed->rank;
  info.world_size = placed->world_size;
  info.local_rank = placed->local_rank;
  info.local_world_size = placed->local_world_size;
  info.host_index = placed->host_index;
  info.num_hosts = placed->num_hosts;
  info.num_slices = ms.num_slices;
  info.slice_index = ms.slice_index;
  info.megascale_coordinator = ms.coordinator;
  if (!*tpu) {
    info.slice.num_hosts = info.num_hosts;
    info.slice.devices_per_host = info.local_world_size;
  }

  if (std::optional<std::string> addr = GetEnv(env, "MASTER_ADDR")) {
    info.master_addr = *addr;
  } else if (info.num_slices > 1) {
    info.master_addr = ms.coordinator_host;  // slice 0's first host
  } else if (!info.hostnames.empty()) {
    info.master_addr = info.hostnames[0];
  } else if (*launcher && (*launcher)->master_addr_hint) {
    info.master_addr = *(*launcher)->master_addr_hint;
  }
  absl::StatusOr<std::optional<int>> port = GetInt(env, "MASTER_PORT", 1, 65535);
  if (!port.ok()) return port.status();
  info.master_port = port->value_or(kDefaultMasterPort);

  if (info.hostnames.empty() && info.num_hosts == 1) info.hostnames = {info.master_addr};
  if (*tpu) {
    const TpuEnv& t = **tpu;
    // A one-host slice of a multi-slice job without TPU_WORKER_HOSTNAMES:
    // its name is unknown (placement uses host_index).
    const bool unnamed_ok = info.num_slices > 1 && t.slice.num_hosts == 1;
    if (info.hostnames.empty() && !unnamed_ok) {
      return UnsetError("TPU_WORKER_HOSTNAMES",
                      absl::StrCat("expected ", t.slice.num_hosts,
                                   " hostnames for a multi-host slice (or "
                                   "TORCH_TPU_SLICEBUILDER_ADDRESSES)"));
    }
    // The ICI endpoints of this slice's devices, rank-in-slice order.
    if (!t.slicebuilder_addresses.empty()) {
      info.slicebuilder_addresses = t.slicebuilder_addresses;
    } else if (!info.hostnames.empty()) {
      info.slicebuilder_addresses = DefaultSlicebuilderAddresses(
          info.hostnames, t.slice.devices_per_host, kSlicebuilderBasePort);
    }
    std::optional<std::string> host_id = GetEnv(env, "TPU_DIST_HOST_ID");
    if (host_id && t.hostnames_given && *host_id != info.hostname()) {
      return EnvError("TPU_DIST_HOST_ID", *host_id,
                      absl::StrCat("expected \"", info.hostname(), "\", the hostname of host ",
                                   info.host_in_slice(),
                                   info.num_slices > 1
                                       ? absl::StrCat(" of slice ", info.slice_index)
                                       : std::string()));
    }
  }
  if (absl::Status s = FillRunIdentity(env, &info); !s.ok()) return s;
  return info;
}

EnvMap EnvMapFromProcess() {
  EnvMap env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

}  // namespace tpudist::tpu_runtime
