#!/usr/bin/env bash
# Emulated hosts in Linux network namespaces, for multi-host tests of
# collectives/tcp (and anything else that dials real addresses).
#
#   tools/netns_hosts.sh up N [SUFFIX]      create hosts tdh0_SUFFIX .. tdh{N-1}_SUFFIX
#   tools/netns_hosts.sh down [SUFFIX]      remove everything created with SUFFIX
#   tools/netns_hosts.sh run N [SUFFIX] -- CMD [ARGS...]
#                                           up, run CMD once per host inside its
#                                           namespace, then down (always, via trap)
#   tools/netns_hosts.sh addr I             print host I's address
#
# Layout for one SUFFIX (default: this shell's pid): a dedicated namespace
# tdbr_SUFFIX holds bridge br0; host I is namespace tdhI_SUFFIX with eth0 =
# 10.250.0.(I+1)/24, a veth whose other end (hI) is enslaved to br0. The
# bridge lives in its own namespace, so parallel runs with different suffixes
# reuse the same subnet without seeing each other, and nothing is added to
# the root namespace. `up` is idempotent (an existing layout with the same
# suffix is torn down first) and cleans up after itself if a step fails.
#
# In `run`, each command gets TDH_RANK=I, TDH_SIZE=N, TDH_ADDR=<address> and
# TDH_SUFFIX in its environment and is bounded by TDH_TIMEOUT seconds
# (default 60). `run` exits 0 only if every host's command exited 0.
#
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2 with `ip netns`.
set -euo pipefail

die() { echo "netns_hosts.sh: $*" >&2; exit 2; }
addr_of() { echo "10.250.0.$(($1 + 1))"; }

need_root() {
  [[ $(id -u) -eq 0 ]] || die "must run as root"
  ip netns list >/dev/null 2>&1 || die "'ip netns' is not available"
}

do_down() {
  local sfx=$1 ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    case "$ns" in
      tdh*_"$sfx"|tdbr_"$sfx") ip netns del "$ns" 2>/dev/null || true ;;
    esac
  done
}

do_up() {
  local n=$1 sfx=$2 br="tdbr_$2" i host
  [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 250 ]] || die "N must be 1..250, got '$n'"
  [[ $sfx =~ ^[A-Za-z0-9]+$ ]] || die "SUFFIX must be alphanumeric, got '$sfx'"
  do_down "$sfx"
  trap 'do_down "$sfx"' ERR
  ip netns add "$br"
  ip -n "$br" link set lo up
  ip -n "$br" link add br0 type bridge
  ip -n "$br" link set br0 up
  for ((i = 0; i < n; i++)); do
    host="tdh${i}_$sfx"
    ip netns add "$host"
    ip -n "$host" link set lo up
    ip -n "$br" link add "h$i" type veth peer name eth0 netns "$host"
    ip -n "$br" link set "h$i" master br0
    ip -n "$br" link set "h$i" up
    ip -n "$host" addr add "$(addr_of "$i")/24" dev eth0
    ip -n "$host" link set eth0 up
  done
  trap - ERR
}

do_run() {
  local n=$1 sfx=$2 i host rc=0
  shift 2
  [[ $# -ge 1 ]] || die "run: no command"
  # shellcheck disable=SC2064
  trap "do_down '$sfx'" EXIT
  trap 'exit 130' INT TERM
  do_up "$n" "$sfx"
  local pids=()
  for ((i = 0; i < n; i++)); do
    host="tdh${i}_$sfx"
    ip netns exec "$host" env TDH_RANK="$i" TDH_SIZE="$n" TDH_ADDR="$(addr_of "$i")" \
      TDH_SUFFIX="$sfx" timeout --kill-after=5 "${TDH_TIMEOUT:-60}" "$@" &
    pids+=($!)
  done
  for ((i = 0; i < n; i++)); do
    if ! wait "${pids[$i]}"; then
      echo "netns_hosts.sh: host $i failed" >&2
      rc=1
    fi
  done
  return $rc
}

cmd=${1:-}
case "$cmd" in
  up)
    need_root
    do_up "${2:?usage: up N [SUFFIX]}" "${3:-$$}"
    echo "up: ${2} hosts, suffix ${3:-$$}"
    ;;
  down)
    need_root
    do_down "${2:-$$}"
    ;;
  run)
    need_root
    n=${2:?usage: run N [SUFFIX] -- CMD...}
    shift 2
    sfx=$$
    if [[ ${1:-} != "--" ]]; then sfx=${1:?}; shift; fi
    [[ ${1:-} == "--" ]] || die "run: expected -- before the command"
    shift
    do_run "$n" "$sfx" "$@"
    ;;
  addr)
    addr_of "${2:?usage: addr I}"
    ;;
  *)
    sed -n '2,23p' "$0" >&2
    exit 2
    ;;
esac
