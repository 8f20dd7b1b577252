"""RankProcess: the Ray actor that runs one rank's binary on one TPU device.

Used by tpu_dist.ray_launcher (one actor per bundle of the slice's placement
group). The actor process itself stays light (no torch): it works out its
place in the slice from what the TPU host gives it, starts the binary as a
child process in a session of its own, buffers its output lines, and stops it
(SIGTERM to the session, SIGKILL after a grace period) when told to. The
child gets SIGKILL if the actor's process dies (PR_SET_PDEATHSIG), so a killed
actor or node leaves no orphaned rank behind.

Thread-safety: Ray runs one method at a time on this actor; the output reader
thread shares only `_lines`, under `_lock`.
"""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Tuple

import ray

# Shipped by value with this module (ray_launcher.py): no torch in the actor.
from tpu_dist.env import tpu_host_place, tpu_slice_name

_PR_SET_PDEATHSIG = 1
_MAX_BUFFERED_LINES = 100_000  # a rank printing faster than we poll drops its oldest lines


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the thread that forked it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class RankProcess:
    """One device of the slice, running one rank of a multi-process binary."""

    def __init__(self) -> None:
        self._proc: Optional[subprocess.Popen] = None
        self._reader: Optional[threading.Thread] = None
        self._lines: Deque[str] = collections.deque(maxlen=_MAX_BUFFERED_LINES)
        self._lock = threading.Lock()

    def place(self) -> Dict[str, Any]:
        """This device's place: the TPU host's (tpu_dist.env.tpu_host_place,
        the Python mirror of discovery), its slice's name (TPU_NAME, through
        tpu_dist.env.tpu_slice_name) and Ray's TPU id."""
        ip = ray.util.get_node_ip_address()
        worker_id, hosts = tpu_host_place()
        tpu_ids = ray.get_runtime_context().get_accelerator_ids().get("TPU", [])
        if not tpu_ids:
            raise RuntimeError(f"actor on {ip} holds no TPU id (resources={{'TPU': 1}} expected)")
        return {"ip": ip, "hosts": hosts or [ip], "pid": os.getpid(),
                "worker_id": worker_id, "tpu_name": tpu_slice_name(),
                # Ray's TPU id on this host: the device index. Not
                # TPU_VISIBLE_CHIPS, which on TPU7x is the chip of 2 devices.
                "local_rank": int(tpu_ids[0])}

    def free_port(self, preferred: int) -> int:
        """`preferred` if it is free on this host, else a free port."""
        for port in (preferred, 0):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("", port))
                except OSError:
                    continue
                return s.getsockname()[1]
        raise RuntimeError("no free port")

    def start(self, argv: List[str], env: Dict[str, str], cwd: str) -> int:
        """Starts the binary with this process's environment plus `env`;
        returns its pid. REQUIRES: nothing started yet on this actor."""
        if self._proc is not None:
            raise RuntimeError("RankProcess.start called twice")
        full_env = dict(os.environ)
        if "TPU_DIST_JOB_SECRET" in env:
            # The launcher's secret wins over a file the node may name: a rank
            # seeing both variables refuses to start.
            full_env.pop("TPU_DIST_JOB_SECRET_FILE", None)
        full_env.update(env)
        self._proc = subprocess.Popen(
            argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
        self._reader = threading.Thread(target=self._read, name="rank-output", daemon=True)
        self._reader.start()
        return self._proc.pid

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for raw in self._proc.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            with self._lock:
                self._lines.append(line)

    def poll(self) -> Tuple[List[str], Optional[int]]:
        """New output lines, and the exit status once the binary has exited
        and its output is drained (Popen's returncode: -N for signal N)."""
        rc = None
        if self._proc is not None and self._proc.poll() is not None:
            assert self._reader is not None
            self._reader.join(timeout=5.0)
            rc = self._proc.returncode
        with self._lock:
            lines = list(self._lines)
            self._lines.clear()
        return lines, rc

    def stop(self, grace_s: float) -> Tuple[List[str], Optional[int]]:
        """SIGTERM to the binary's session, SIGKILL after `grace_s`; returns
        what poll() would after it exited."""
        if self._proc is None:
            return [], None
        if self._proc.poll() is None:
            self._signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self._proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        self._signal(signal.SIGKILL)  # whatever is left of its session
        self._proc.wait()
        return self.poll()

    def flight_recorder_dump(self, path: str, ask: bool, wait_s: float) -> Optional[bytes]:
        """The bytes of this rank's flight-recorder dump at `path` (on this
        node), or None if there is none. With `ask`, a binary still running
        that has not dumped gets SIGUSR1 (tpu_dist dumps on it) and up to
        `wait_s` to do so."""
        if ask and not os.path.isfile(path) and self._proc is not None \
                and self._proc.poll() is None:
            self._signal(signal.SIGUSR1)
            deadline = time.monotonic() + wait_s
            while not os.path.isfile(path) and time.monotonic() < deadline:
                time.sleep(0.05)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            return None

    def _signal(self, sig: int) -> None:
        assert self._proc is not None
        try:
            os.killpg(self._proc.pid, sig)
        except ProcessLookupError:
            pass
