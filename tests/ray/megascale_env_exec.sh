#!/bin/sh
# Test helper (tests/ray/test_ray_launcher_slices.py): prints the multi-slice
# variables this rank was started with, on one line, then execs the command
# (same pid: the launcher's rank:host/pid list still names the binary).
#   tpu_dist-ray-run --num-slices 2 ... -- tests/ray/megascale_env_exec.sh BINARY [ARGS...]
echo "megascale_env: restart=${TPU_DIST_RESTART_COUNT-} LOCAL_RANK=${LOCAL_RANK-}" \
  "TPU_NAME=${TPU_NAME-} MEGASCALE_COORDINATOR_ADDRESS=${MEGASCALE_COORDINATOR_ADDRESS-}" \
  "MEGASCALE_PORT=${MEGASCALE_PORT-} MEGASCALE_NUM_SLICES=${MEGASCALE_NUM_SLICES-}" \
  "MEGASCALE_SLICE_ID=${MEGASCALE_SLICE_ID-}"
exec "$@"
