#!/usr/bin/env bash
# A local multi-node Ray cluster of emulated TPU hosts: one head node and one
# `ray start` worker node per TPU host, each carrying what a GKE TPU node
# carries under KubeRay + the KubeRay TPU webhook (docs/ray.md).
#
#   tools/ray_cluster.sh up SPEC [--net netns|loopback] [--chips-per-host N]
#                                [--num-slices S] [--dashboard] [--gcs-port P]
#                                [--object-store-mb M] [--auth token|disabled]
#   tools/ray_cluster.sh down            stop exactly what `up` started (idempotent)
#   tools/ray_cluster.sh status          nodes, pids, addresses; exit 0 up, 1 broken, 3 down
#   tools/ray_cluster.sh exec [--host J] -- CMD [ARGS...]
#                                        run CMD on the head (default) or on TPU host J,
#                                        with RAY_ADDRESS and that node's environment
#   tools/ray_cluster.sh env SPEC [--net M] [--chips-per-host N] [--num-slices S]
#                                [--host J|head] [--auth token|disabled]
#                                        print the environment a node gets; starts nothing
#
# SPEC is GENERATION-TOPOLOGY in chips: v6e-4x4 (4 hosts x 4 devices) and
# tpu7x-2x2x2 (2 hosts x 8 devices, RAY_TPU_RESOURCE_PER_CHIP=2) are the seed's
# slices; v4-2x2x2 / v5p-2x2x2 (2 hosts x 4) are the smallest multi-host slices
# that Ray's TPU code and tpu_runtime agree on; v5e/v6e 1x1, 2x2, 2x4 are one
# host, as in Ray (--chips-per-host 4 makes v6e-2x4 two 4-chip hosts, like GKE's
# ct6e-standard-4t; Ray callers then pass chips_per_vm=4).
#
# --num-slices S (default 1): S slices of SPEC, as a KubeRay TPU worker group
# with `replicas: S`: slice s's hosts get TPU_NAME=<group>-s and
# TPU_WORKER_ID 0..hosts-1 of their own slice, and TPU_WORKER_HOSTNAMES /
# slicebuilder addresses name that slice's hosts only (<group>-s-j.<cluster>-
# headless in netns mode, 127.0.(s+1).(j+1) on loopback, as tpurun
# --num-slices). Ray derives one ray.io/tpu-slice-name per slice and a
# TPU-<pod>-head resource on each slice's worker 0 from that, which is all
# ray.util.tpu.SlicePlacementGroup(num_slices=S) reads. MEGASCALE_* are not
# set on the nodes (the webhook sets them only where the pod spec names
# MEGASCALE_NUM_SLICES; Ray computes them per job). TPU host J of the whole
# cluster (exec/env --host J) is host J % hosts of slice J / hosts.
#
# What a TPU worker node gets (read from Ray 2.60's ray/_private/accelerators/
# tpu.py and KubeRay 1.7's pod builder; Ray derives its TPU labels and
# resources itself from these, nothing of Ray's is patched):
#   ray start --resources '{"TPU": devices_per_host}' --num-cpus devices_per_host
#   TPU_WORKER_ID, TPU_WORKER_HOSTNAMES, TPU_NAME (webhook), TPU_ACCELERATOR_TYPE,
#   TPU_TOPOLOGY (GKE), TORCH_TPU_TOPOLOGY, TORCH_TPU_SLICEBUILDER_ADDRESSES,
#   RAY_TPU_RESOURCE_PER_CHIP (tpu7x), TPU_PROCESS_ADDRESSES/PORT (tpu7x webhook),
#   RAY_NODE_TYPE_NAME, RAY_CLOUD_INSTANCE_ID, RAY_CLUSTER_NAME (KubeRay).
#
# --net netns (default when root with `ip netns`): node I (0 = head, J+1 = TPU
# host J) runs in namespace tdhI_SUFFIX from tools/netns_hosts.sh, address
# 10.250.0.(I+1); each namespace's /etc/hosts (/etc/netns/NS/hosts) resolves the
# KubeRay names: TPU host J is <group>-0-J.ray-torchtpu-cluster-headless, the
# head ray-torchtpu-cluster-head-svc. Drivers must run inside a namespace: use
# `exec`. --net loopback: head 127.0.1.254, TPU host J 127.0.1.(J+1) (as
# tpurun), hostnames are those addresses, each node its own block of ports;
# Ray listens on all interfaces (also in netns mode, where that is the
# namespace's), so in loopback mode its ports are open on the machine's network.
#
# Ray's token authentication (Ray >= 2.52) is chosen explicitly, the same for
# every node and every `exec` driver, never left to Ray's defaults (which turn
# token mode on for a head only when a ~/.ray/auth_token happens to exist, and
# never for `ray start --address`). --auth token (default, what Ray
# recommends): `up` draws a fresh token (secrets.token_hex(32), as Ray's own
# generator) into $state/auth_token (0600) and every node and `exec` command
# gets RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH to it (a caller's
# RAY_AUTH_TOKEN, which would take precedence, is dropped); the caller's
# ~/.ray/auth_token is neither read nor written. Outside `exec`:
# RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$state/auth_token. --auth disabled:
# RAY_AUTH_MODE=disabled everywhere (anyone who reaches the ports can run code).
#
# Every port a node needs is checked before it starts (fails naming the port).
# The state dir ($TPU_DIST_RAY_STATE, default /tmp/tdray; kept short: Ray's
# unix sockets live under it) records each node's pid (its own session), the
# namespaces, logs and Ray temp dirs; `down` stops those sessions by pid
# (SIGTERM, then SIGKILL after $TPU_DIST_RAY_GRACE s, default 20), kills what is
# left inside the namespaces, removes the namespaces and the state dir.
# $TPU_DIST_RAY_TIMEOUT (default 120) bounds each startup wait.
# $TPU_DIST_RAY_PASS_ENV lists caller variables to pass to every node.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv"
ray_bin="$venv/bin/ray"
py_bin="$venv/bin/python"
state="${TPU_DIST_RAY_STATE:-/tmp/tdray}"
timeout_s="${TPU_DIST_RAY_TIMEOUT:-120}"
grace_s="${TPU_DIST_RAY_GRACE:-20}"
cluster_name="ray-torchtpu-cluster"
head_svc="$cluster_name-head-svc"
head_fqdn="$head_svc.default.svc.cluster.local"

die() { echo "ray_cluster.sh: $*" >&2; exit 2; }
note() { echo "ray_cluster.sh: $*" >&2; }

[[ $state == /* ]] || die "TPU_DIST_RAY_STATE must be an absolute path, got '$state'"
[[ ${#state} -le 40 ]] || die "TPU_DIST_RAY_STATE='$state' is longer than 40 characters: Ray's unix socket paths under it would pass the 107-byte limit"
[[ $state =~ ^[A-Za-z0-9/._-]+$ ]] || die "TPU_DIST_RAY_STATE='$state': expected only [A-Za-z0-9/._-]"
suffix="ray$(printf '%s' "$state" | cksum | cut -d' ' -f1)"

# ---------------------------------------------------------------- processes --

# "STARTTIME SID" of PID from /proc/PID/stat, or nothing when it is gone.
proc_stat() {
  local line rest
  read -r line 2>/dev/null <"/proc/$1/stat" || return 0
  rest=${line##*) }
  # shellcheck disable=SC2086
  set -- $rest
  echo "${20} $4"
}

# Pids of every process whose session id is one of the arguments.
session_members() {
  local d line rest sid want
  for d in /proc/[0-9]*; do
    read -r line 2>/dev/null <"$d/stat" || continue
    rest=${line##*) }
    # shellcheck disable=SC2086
    set -- $rest
    sid=$4
    [[ $1 == Z || $1 == X ]] && continue  # exited, not yet reaped: gone for our purposes
    for want in "${sessions[@]}"; do
      if [[ $sid == "$want" ]]; then echo "${d#/proc/}"; break; fi
    done
  done
}

# The recorded node pids that are still the processes we started.
live_roots() {
  local name pid start cur
  [[ -f $state/pids ]] || return 0
  while read -r name pid start; do
    cur=$(proc_stat "$pid")
    [[ -n $cur && ${cur%% *} == "$start" ]] && echo "$pid"
  done <"$state/pids"
  return 0
}

# ---------------------------------------------------------------- the spec --

# Sets gen, topo, chips, cph (chips per host), rpc (Ray TPU resources per
# chip), hosts, dph (devices per host), accel (TPU_ACCELERATOR_TYPE = worker
# group name), torch_topo (TORCH_TPU_TOPOLOGY).
parse_spec() {
  local spec=$1 cph_override=$2 want_dims cores d
  gen=${spec%%-*}
  topo=${spec#*-}
  [[ $spec == *-* && -n $topo ]] || die "SPEC '$spec': expected GENERATION-TOPOLOGY, like v6e-4x4 or tpu7x-2x2x2"
  case "$gen" in
    v4 | v5p) want_dims=3 cores=2 rpc=1 ;;
    tpu7x | v7x) gen=tpu7x want_dims=3 cores=2 rpc=2 ;;
    v5e | v5litepod) gen=v5litepod want_dims=2 cores=1 rpc=1 ;;
    v6e) want_dims=2 cores=1 rpc=1 ;;
    *) die "SPEC '$spec': generation '$gen' is not one of v4, v5p, v5e, v6e, tpu7x" ;;
  esac
  [[ $topo =~ ^[1-9][0-9]*(x[1-9][0-9]*)+$ ]] || die "SPEC '$spec': topology '$topo' is not like 4x4 or 2x2x2"
  IFS=x read -r -a dims <<<"$topo"
  [[ ${#dims[@]} -eq $want_dims ]] || die "SPEC '$spec': $gen topologies have $want_dims dimensions, '$topo' has ${#dims[@]}"
  chips=1
  for d in "${dims[@]}"; do chips=$((chips * d)); done
  if [[ -n $cph_override ]]; then
    [[ $cph_override =~ ^[1-9][0-9]*$ ]] || die "--chips-per-host: expected a positive integer, got '$cph_override'"
    cph=$cph_override
  elif [[ ($gen == v5litepod || $gen == v6e) && ($topo == 1x1 || $topo == 2x2 || $topo == 2x4) ]]; then
    cph=$chips # Ray's get_chips_per_host: one v5e/v6e host holds these
  else
    cph=$((chips < 4 ? chips : 4))
  fi
  ((chips % cph == 0)) || die "SPEC '$spec': $chips chips do not fill whole hosts of $cph chips"
  hosts=$((chips / cph))
  dph=$((cph * rpc))
  accel="$gen-$((chips * cores))"
  torch_topo=$(IFS=,; echo "${dims[*]}")
  ((${#dims[@]} == 2)) && torch_topo+=",1"
  ((rpc > 1)) && torch_topo+=",$rpc"
  return 0
}

# ------------------------------------------------------------------ layout --

# Node I: 0 is the head, J+1 is TPU host J (slice-major: host J % hosts of
# slice J / hosts). Sets ns (empty in loopback mode), addr, base (first port
# of its block).
node_layout() {
  local i=$1
  if [[ $net == netns ]]; then
    ns="tdh${i}_$suffix"
    addr="10.250.0.$((i + 1))"
    base=20000
  else
    ns=""
    if ((i == 0)); then addr=127.0.1.254; else addr=$(tpu_hostname $(((i - 1) % hosts)) $(((i - 1) / hosts))); fi
    base=$((20000 + 1000 * i))
  fi
}

# The hostname the webhook gives host J of slice S (default 0).
tpu_hostname() {
  if [[ $net == netns ]]; then
    echo "$accel-${2:-0}-$1.$cluster_name-headless"
  else
    echo "127.0.$((${2:-0} + 1)).$(($1 + 1))"
  fi
}

head_address() {
  if [[ $net == netns ]]; then echo "10.250.0.1:$gcs_port"; else echo "127.0.1.254:$gcs_port"; fi
}

# "PORT:WHAT" lines for node I.
node_ports() {
  local i=$1 p
  node_layout "$i"
  if ((i == 0)); then
    echo "$gcs_port:GCS"
    [[ $dashboard == 1 ]] && echo "8265:dashboard"
  fi
  echo "$base:node-manager"
  echo "$((base + 1)):object-manager"
  echo "$((base + 2)):metrics-export"
  echo "$((base + 3)):dashboard-agent-grpc"
  echo "$((base + 4)):dashboard-agent-listen"
  echo "$((base + 5)):runtime-env-agent"
  for ((p = base + 100; p < base + 400; p++)); do echo "$p:worker"; done
}

in_ns() { # NS CMD...: run CMD in NS, or here when NS is empty
  local target=$1
  shift
  if [[ -n $target ]]; then ip netns exec "$target" "$@"; else "$@"; fi
}

# Fails naming every port of node I that something already holds.
check_ports() {
  local i=$1 taken
  node_layout "$i"
  taken=$(node_ports "$i" | in_ns "$ns" "$py_bin" -c '
import socket, sys
for line in sys.stdin:
    port, what = line.strip().split(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # As Ray'"'"'s gRPC servers: TIME_WAIT leftovers do not count, listeners do.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", int(port)))
    except OSError as e:
        print(f"{port} ({what}): {e.strerror}")
    finally:
        s.close()
') || die "could not check ports of node $i"
  if [[ -n $taken ]]; then
    echo "ray_cluster.sh: ports needed by node $i (${addr}${ns:+ in namespace $ns}) are taken:" >&2
    echo "$taken" | head -5 | sed 's/^/  port /' >&2
    return 1
  fi
}

# The environment of node I as KEY=VALUE lines.
node_env() {
  local i=$1 j sl h l names=() sb=() pa=() v
  node_layout "$i"
  echo "PATH=$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  echo "HOME=${HOME:-/root}"
  echo "LANG=C.UTF-8"
  echo "VIRTUAL_ENV=$venv"
  echo "RAY_USAGE_STATS_ENABLED=0"
  for v in ${TPU_DIST_RAY_PASS_ENV:-}; do
    [[ -n ${!v+x} ]] && echo "$v=${!v}"
  done
  # Ray's authentication: one explicit mode for every node (see the header).
  echo "RAY_AUTH_MODE=$auth"
  [[ $auth == token ]] && echo "RAY_AUTH_TOKEN_PATH=$state/auth_token"
  # KubeRay's pod builder.
  echo "RAY_CLUSTER_NAME=$cluster_name"
  echo "RAY_CLUSTER_NAMESPACE=default"
  echo "RAY_PORT=$gcs_port"
  echo "RAY_ADDRESS=$(head_address)"
  ((rpc > 1)) && echo "RAY_TPU_RESOURCE_PER_CHIP=$rpc" # the seed's manifest, head and workers
  if ((i == 0)); then
    echo "RAY_NODE_TYPE_NAME=headgroup"
    echo "RAY_CLOUD_INSTANCE_ID=$cluster_name-head-0"
    return 0
  fi
  j=$(((i - 1) % hosts))
  sl=$(((i - 1) / hosts))
  echo "RAY_NODE_TYPE_NAME=$accel"
  echo "RAY_CLOUD_INSTANCE_ID=$cluster_name-$accel-worker-$((i - 1))"
  if [[ $net == netns ]]; then
    echo "FQ_RAY_IP=$head_fqdn"
    echo "RAY_IP=$head_svc"
  fi
  for ((h = 0; h < hosts; h++)); do
    names+=("$(tpu_hostname "$h" "$sl")")
    pa+=("$(tpu_hostname "$h" "$sl"):8471")
    for ((l = 0; l < dph; l++)); do sb+=("$(tpu_hostname "$h" "$sl"):$((8471 + l))"); done
  done
  # The KubeRay TPU webhook (hostnames and process addresses only on multi-host slices).
  echo "TPU_WORKER_ID=$j"
  echo "TPU_NAME=$accel-$sl"
  if ((hosts > 1)); then
    (IFS=,; echo "TPU_WORKER_HOSTNAMES=${names[*]}")
    if [[ $gen == tpu7x ]]; then
      (IFS=,; echo "TPU_PROCESS_ADDRESSES=${pa[*]}")
      echo "TPU_PROCESS_PORT=8471"
    fi
  fi
  # GKE.
  echo "TPU_ACCELERATOR_TYPE=$accel"
  echo "TPU_TOPOLOGY=$topo"
  # TorchTPU (the seed's webhook environment).
  echo "TORCH_TPU_TOPOLOGY=$torch_topo"
  (IFS=,; echo "TORCH_TPU_SLICEBUILDER_ADDRESSES=${sb[*]}")
}

# The `ray start` arguments of node I.
node_args() {
  local i=$1
  node_layout "$i"
  local args=(start --block --node-ip-address="$addr" --disable-usage-stats
    --temp-dir="$state/tmp/n$i" --object-store-memory=$((object_store_mb * 1024 * 1024))
    --node-manager-port="$base" --object-manager-port=$((base + 1))
    --metrics-export-port=$((base + 2)) --dashboard-agent-grpc-port=$((base + 3))
    --dashboard-agent-listen-port=$((base + 4)) --runtime-env-agent-port=$((base + 5))
    --min-worker-port=$((base + 100)) --max-worker-port=$((base + 399)))
  if ((i == 0)); then
    # No Ray Client server: it needs ray[client], which ray[train] does not pull in.
    args+=(--head --port="$gcs_port" --num-cpus=0)
    if [[ $dashboard == 1 ]]; then
      args+=(--include-dashboard=true --dashboard-host=0.0.0.0 --dashboard-port=8265)
    else
      args+=(--include-dashboard=false)
    fi
  else
    if [[ $net == netns ]]; then
      args+=(--address="$head_fqdn:$gcs_port")
    else
      args+=(--address="$(head_address)")
    fi
    args+=(--num-cpus="$dph" --resources="{\"TPU\": $dph}")
  fi
  printf '%s\n' "${args[@]}"
}

hosts_file() {
  local h sl
  echo "127.0.0.1 localhost"
  echo "10.250.0.1 $head_fqdn $head_svc $cluster_name-head-0"
  for ((sl = 0; sl < slices; sl++)); do
    for ((h = 0; h < hosts; h++)); do
      echo "10.250.0.$((sl * hosts + h + 2)) $(tpu_hostname "$h" "$sl") $accel-$sl-$h"
    done
  done
}

# Checks --num-slices S; sets slices and nodes (TPU hosts of every slice).
set_slices() {
  [[ $1 =~ ^[1-9][0-9]*$ ]] || die "--num-slices: expected a positive integer, got '$1'"
  slices=$1
  nodes=$((hosts * slices))
}

# Validates $auth and that TPU_DIST_RAY_PASS_ENV does not carry Ray's auth
# variables (they would override the mode or the token the nodes must share).
check_auth() {
  local v
  [[ $auth == token || $auth == disabled ]] || die "--auth: expected token or disabled, got '$auth'"
  for v in ${TPU_DIST_RAY_PASS_ENV:-}; do
    [[ $v == RAY_AUTH_* ]] && die "TPU_DIST_RAY_PASS_ENV names $v: Ray's authentication is set by --auth (token: a per-cluster token in \$TPU_DIST_RAY_STATE/auth_token)"
  done
  return 0
}

# ------------------------------------------------------------------ up/down --

start_node() { # I
  local i=$1 envs=() args=() pid
  node_layout "$i"
  mapfile -t envs <"$state/env/n$i.env"
  mapfile -t args < <(node_args "$i")
  mkdir -p "$state/tmp/n$i"
  if [[ -n $ns ]]; then
    setsid ip netns exec "$ns" env -i "${envs[@]}" "$ray_bin" "${args[@]}" \
      >"$state/logs/n$i.log" 2>&1 </dev/null 9<&- &
  else
    setsid env -i "${envs[@]}" "$ray_bin" "${args[@]}" >"$state/logs/n$i.log" 2>&1 </dev/null 9<&- &
  fi
  pid=$!
  # setsid and `ip netns exec` exec in place: $! is the ray start process,
  # the leader of a session that holds every process of this node. (9<&-:
  # the nodes must not hold the up/down lock.)
  local st
  st=$(proc_stat "$pid")
  [[ -n $st ]] || { note "node $i exited at once; see $state/logs/n$i.log"; return 1; }
  echo "n$i $pid ${st%% *}" >>"$state/pids"
}

wait_started() { # I...: until each node's ray start says it blocks
  local i pid deadline=$((SECONDS + timeout_s))
  for i in "$@"; do
    pid=$(awk -v n="n$i" '$1 == n {print $2}' "$state/pids")
    until grep -q "block forever" "$state/logs/n$i.log" 2>/dev/null; do
      if [[ -z $(proc_stat "$pid") ]]; then
        note "node $i (pid $pid) exited during startup; last lines of $state/logs/n$i.log:"
        tail -15 "$state/logs/n$i.log" >&2 || true
        return 1
      fi
      if ((SECONDS > deadline)); then
        note "node $i not up after ${timeout_s}s; last lines of $state/logs/n$i.log:"
        tail -15 "$state/logs/n$i.log" >&2 || true
        return 1
      fi
      sleep 0.2
    done
  done
}

# Connects a driver to the head and waits until every TPU host has joined
# with its TPU resource and the labels Ray derives from the TPU environment.
probe() {
  local envs=()
  node_layout 0
  mapfile -t envs <"$state/env/n0.env"
  in_ns "$ns" env -u RAY_AUTH_TOKEN "${envs[@]}" "$py_bin" - "$timeout_s" "$nodes" "$dph" "$slices" <<'EOF'
import sys, time
import ray

timeout_s, hosts, dph = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
slices = int(sys.argv[4])
deadline = time.monotonic() + timeout_s
ray.init(logging_level="ERROR", log_to_driver=False)
need = ("ray.io/tpu-worker-id", "ray.io/tpu-slice-name", "ray.io/tpu-pod-type",
        "ray.io/tpu-topology", "ray.io/accelerator-type")
while True:
    tpu = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("TPU")]
    if len(tpu) >= hosts:
        break
    if time.monotonic() > deadline:
        sys.exit(f"only {len(tpu)} of {hosts} TPU hosts joined within {timeout_s:.0f}s")
    time.sleep(0.5)
tpu.sort(key=lambda n: (n["Labels"].get("ray.io/tpu-slice-name", ""),
                       int(n["Labels"].get("ray.io/tpu-worker-id", "-1"))))
names = {n["Labels"].get("ray.io/tpu-slice-name") for n in tpu}
if len(names) != slices:
    sys.exit(f"Ray sees {len(names)} TPU slice names {sorted(map(str, names))}, expected {slices}")
for n in tpu:
    labels, res = n["Labels"], n["Resources"]
    missing = [k for k in need if k not in labels]
    if missing or res["TPU"] != dph:
        sys.exit(f"node {n['NodeManagerAddress']}: TPU={res['TPU']} (expected {dph}), "
                 f"labels missing {missing}: Ray did not derive the TPU node from the environment")
    extra = sorted(k for k in res if k.startswith("TPU-") or k.startswith("accelerator_type:"))
    print(f"  {n['NodeManagerAddress']:<12} worker {labels['ray.io/tpu-worker-id']}  "
          f"TPU={res['TPU']:g}  {labels['ray.io/tpu-pod-type']} {labels['ray.io/tpu-topology']}  "
          f"slice {labels['ray.io/tpu-slice-name']}  {' '.join(extra)}")
EOF
}

up_failed() {
  local rc=$?
  ((rc == 0)) && return 0
  note "up failed (exit $rc); stopping what it started"
  do_down >/dev/null 2>&1 || true
}

do_up() {
  local spec=$1 i t0=$SECONDS
  shift
  net="" cph_override="" dashboard=0 gcs_port=6379 object_store_mb=100 auth=token slices=1
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --net) net=${2:?--net needs netns or loopback}; shift 2 ;;
      --chips-per-host) cph_override=${2:?}; shift 2 ;;
      --num-slices) slices=${2:?--num-slices needs a number}; shift 2 ;;
      --dashboard) dashboard=1; shift ;;
      --gcs-port) gcs_port=${2:?}; shift 2 ;;
      --object-store-mb) object_store_mb=${2:?}; shift 2 ;;
      --auth) auth=${2:?--auth needs token or disabled}; shift 2 ;;
      *) die "up: unknown argument '$1'" ;;
    esac
  done
  [[ $gcs_port =~ ^[0-9]+$ && $gcs_port -ge 1024 && $gcs_port -le 65535 ]] || die "--gcs-port: expected 1024..65535, got '$gcs_port'"
  [[ $object_store_mb =~ ^[0-9]+$ && $object_store_mb -ge 80 ]] || die "--object-store-mb: expected >= 80 (Ray's minimum is 75 MiB), got '$object_store_mb'"
  check_auth
  parse_spec "$spec" "$cph_override"
  set_slices "$slices"
  [[ -x $ray_bin ]] || die "$ray_bin not found: run tools/install_deps.sh"
  if [[ $dashboard == 1 ]] && ! "$py_bin" -c "import aiohttp, aiohttp_cors" 2>/dev/null; then
    die "--dashboard needs ray[default] (aiohttp, aiohttp_cors) in $venv; ray[train] alone has no dashboard"
  fi
  if [[ -z $net ]]; then
    if [[ $(id -u) -eq 0 ]] && ip netns list >/dev/null 2>&1; then
      net=netns
    else
      net=loopback
      note "not root or no 'ip netns': falling back to --net loopback"
    fi
  fi
  case "$net" in
    netns) [[ $(id -u) -eq 0 ]] || die "--net netns needs root" ;;
    loopback) ;;
    *) die "--net: expected netns or loopback, got '$net'" ;;
  esac
  local max_hosts=44
  [[ $net == netns ]] && max_hosts=249
  ((nodes <= max_hosts)) || die "$nodes hosts ($slices slice(s) x $hosts) is more than $max_hosts (--net $net)"

  if [[ -d $state ]]; then
    if [[ -n $(live_roots) ]]; then
      die "a cluster is already up (state $state: $(cat "$state/spec" 2>/dev/null)); run 'tools/ray_cluster.sh down' first"
    fi
    note "removing the stale state of a cluster that is gone ($state)"
    do_down >/dev/null
  fi
  mkdir -p "$state/logs" "$state/env" "$state/tmp"
  : >"$state/pids"
  local per_slice=""
  ((slices > 1)) && per_slice="slices=$slices x "
  echo "$spec --net $net (${per_slice}hosts=$hosts x $dph devices, $accel, TORCH_TPU_TOPOLOGY=$torch_topo)" >"$state/spec"
  declare -p spec net cph_override dashboard gcs_port object_store_mb auth slices >"$state/config"
  trap up_failed EXIT
  trap 'exit 130' INT TERM
  if [[ $auth == token ]]; then
    # The cluster's own token (not the caller's ~/.ray/auth_token): gone with `down`.
    (umask 077 && "$py_bin" -c 'import secrets; print(secrets.token_hex(32), end="")' \
      >"$state/auth_token") || die "could not write $state/auth_token"
  fi

  if [[ $net == netns ]]; then
    echo "$suffix" >"$state/netns_suffix"
    "$root/tools/netns_hosts.sh" up $((nodes + 1)) "$suffix" >/dev/null
    ip netns list | awk -v s="_$suffix" '$1 ~ s"$" {print $1}' >"$state/namespaces"
    [[ -d /etc/netns ]] || touch "$state/created_etc_netns"
    for ((i = 0; i <= nodes; i++)); do
      node_layout "$i"
      mkdir -p "/etc/netns/$ns"
      hosts_file >"/etc/netns/$ns/hosts"
    done
  fi
  for ((i = 0; i <= nodes; i++)); do
    check_ports "$i"
    node_env "$i" >"$state/env/n$i.env"
  done

  start_node 0
  wait_started 0
  for ((i = 1; i <= nodes; i++)); do start_node "$i"; done
  wait_started $(seq 1 "$nodes")
  echo "up: $(cat "$state/spec")"
  probe
  trap - EXIT INT TERM
  echo "RAY_ADDRESS=$(head_address)  (in $((SECONDS - t0))s; auth: $auth; drivers: tools/ray_cluster.sh exec -- python ...)"
}

do_down() {
  local roots=() sessions=() left=() ns_list=() n p deadline sfx
  if [[ ! -d $state ]]; then
    echo "down: no cluster (no $state)"
    return 0
  fi
  mapfile -t roots < <(live_roots)
  sessions=("${roots[@]}")
  for p in "${roots[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  deadline=$((SECONDS + grace_s))
  while :; do
    mapfile -t left < <(((${#sessions[@]})) && session_members)
    ((${#left[@]} == 0)) && break
    if ((SECONDS >= deadline)); then
      note "down: ${#left[@]} processes still up after ${grace_s}s; SIGKILL: ${left[*]}"
      for p in "${left[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
      # A SIGKILLed process with a large address space takes a while to go
      # on a loaded machine; wait for it (bounded).
      deadline=$((SECONDS + 15))
      while :; do
        mapfile -t left < <(session_members)
        ((${#left[@]} == 0 || SECONDS >= deadline)) && break
        sleep 0.2
      done
      ((${#left[@]} == 0)) || note "down: still alive 15s after SIGKILL: ${left[*]}"
      break
    fi
    sleep 0.2
  done
  if [[ -f $state/netns_suffix ]]; then
    sfx=$(cat "$state/netns_suffix")
    mapfile -t ns_list < <(ip netns list 2>/dev/null | awk -v s="_$sfx" '$1 ~ s"$" {print $1}')
    # Whatever still runs inside our namespaces was started through `exec`.
    for n in "${ns_list[@]}"; do
      for p in $(ip netns pids "$n" 2>/dev/null); do kill -TERM "$p" 2>/dev/null || true; done
    done
    deadline=$((SECONDS + 5))
    for n in "${ns_list[@]}"; do
      while [[ -n $(ip netns pids "$n" 2>/dev/null) ]] && ((SECONDS < deadline)); do sleep 0.2; done
      for p in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    done
    "$root/tools/netns_hosts.sh" down "$sfx"
    for n in "${ns_list[@]}"; do rm -rf "/etc/netns/$n"; done
    rm -rf /etc/netns/tdh*_"$sfx"
    [[ -f $state/created_etc_netns ]] && rmdir /etc/netns 2>/dev/null || true
  fi
  rm -rf "$state"
  echo "down: stopped ${#roots[@]} nodes${sfx:+, removed namespaces *_$sfx}"
}

do_status() {
  local name pid start cur rc=0
  if [[ ! -d $state ]]; then
    echo "down (no $state)"
    return 3
  fi
  echo "up: $(cat "$state/spec" 2>/dev/null)"
  slices=1
  # shellcheck disable=SC1091
  source "$state/config"
  parse_spec "$spec" "$cph_override"
  set_slices "$slices"
  while read -r name pid start; do
    cur=$(proc_stat "$pid")
    node_layout "${name#n}"
    if [[ -n $cur && ${cur%% *} == "$start" ]]; then
      sessions=("$pid")
      echo "  $name $addr${ns:+ (ns $ns)} pid $pid, $(session_members | wc -l) processes"
    else
      echo "  $name $addr${ns:+ (ns $ns)} pid $pid GONE (log $state/logs/$name.log)"
      rc=1
    fi
  done <"$state/pids"
  if [[ ${auth:-} == token ]]; then
    echo "auth: token (RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$state/auth_token)"
  else
    echo "auth: ${auth:-unknown}"
  fi
  echo "RAY_ADDRESS=$(head_address)"
  return $rc
}

do_exec() {
  local host="" i envs=()
  while [[ $# -gt 0 && $1 != "--" ]]; do
    case "$1" in
      --host) host=${2:?}; shift 2 ;;
      *) die "exec: unknown argument '$1' (expected [--host J] -- CMD...)" ;;
    esac
  done
  [[ ${1:-} == "--" ]] || die "exec: expected -- before the command"
  shift
  [[ $# -ge 1 ]] || die "exec: no command"
  [[ -d $state && -n $(live_roots) ]] || die "no cluster is up (state $state)"
  slices=1
  # shellcheck disable=SC1091
  source "$state/config"
  parse_spec "$spec" "$cph_override"
  set_slices "$slices"
  i=0
  if [[ -n $host ]]; then
    [[ $host =~ ^[0-9]+$ && $host -lt $nodes ]] || die "--host: expected 0..$((nodes - 1)), got '$host'"
    i=$((host + 1))
  fi
  node_layout "$i"
  mapfile -t envs <"$state/env/n$i.env"
  # A caller's RAY_AUTH_TOKEN would take precedence over the cluster's token file.
  if [[ -n $ns ]]; then
    exec ip netns exec "$ns" env -u RAY_AUTH_TOKEN "${envs[@]}" "$@"
  fi
  exec env -u RAY_AUTH_TOKEN "${envs[@]}" "$@"
}

# Prints the environment node J would get (no root, starts nothing).
do_env() {
  local spec=$1 host=0 i
  shift
  net=netns cph_override="" dashboard=0 gcs_port=6379 auth=token slices=1
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --net) net=${2:?}; shift 2 ;;
      --chips-per-host) cph_override=${2:?}; shift 2 ;;
      --num-slices) slices=${2:?}; shift 2 ;;
      --host) host=${2:?}; shift 2 ;;
      --auth) auth=${2:?}; shift 2 ;;
      *) die "env: unknown argument '$1'" ;;
    esac
  done
  check_auth
  [[ $net == netns || $net == loopback ]] || die "--net: expected netns or loopback, got '$net'"
  parse_spec "$spec" "$cph_override"
  set_slices "$slices"
  if [[ $host == head ]]; then
    i=0
  else
    [[ $host =~ ^[0-9]+$ && $host -lt $nodes ]] || die "--host: expected head or 0..$((nodes - 1)), got '$host'"
    i=$((host + 1))
  fi
  node_env "$i"
}

# One up/down at a time (on this script's file: nothing is left behind).
lock() {
  exec 9<"$0"
  flock -w 300 9 || die "another up/down did not finish within 300s"
}

cmd=${1:-}
[[ $# -gt 0 ]] && shift
case "$cmd" in
  up)
    [[ $# -ge 1 ]] || die "usage: up SPEC [--net netns|loopback] [--chips-per-host N] [--num-slices S] [--dashboard] [--gcs-port P] [--object-store-mb M] [--auth token|disabled]"
    lock
    do_up "$@"
    ;;
  down)
    lock
    do_down
    ;;
  status) do_status ;;
  exec) do_exec "$@" ;;
  env)
    [[ $# -ge 1 ]] || die "usage: env SPEC [--net netns|loopback] [--chips-per-host N] [--num-slices S] [--host J|head] [--auth token|disabled]"
    do_env "$@"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2
    exit 2
    ;;
esac
