"""tpu_dist as torchft's replica-group backend (issue 33 item 3).

    from tpu_dist.torchft import ProcessGroupTpuDist
    from torchft import Manager

    pg = ProcessGroupTpuDist(timeout=timedelta(seconds=10))
    manager = Manager(pg=pg, ...)  # the replica dimension runs over tpu_dist

torchft's Manager calls `configure(store_addr, replica_id, rank, world_size,
...)` once per quorum with a fresh store prefix
(`host:port/torchft/<quorum id>/<group rank>`), `abort()` when an op fails,
`errored()` before committing a step and `shutdown()` at the end. Here:

* configure: the group is re-formed with torch's Backend reconfigure API
  (`supports_reconfigure`, `get_reconfigure_handle`, `reconfigure` on the
  C++ ProcessGroupTpuDist): every member publishes its instance's handle
  under the quorum's prefix, reads the others', and calls `reconfigure` with
  the handles in rank order and the hint `store_prefix` = the quorum's
  prefix. The same tpu_dist instance (its op threads, its flight recorder)
  is kept from quorum to quorum while the quorum's store (the primary
  replica group's TCPStore) stays the same; a process's first configure, or
  one onto another store (the primary changed), makes a new instance, first
  as a one-member group over that store, then reconfigured like the others,
  so that old and new members meet in the same keys. The old instance is
  aborted and shut down (threads joined, shm segments and sockets closed).
* abort: ProcessGroupTpuDist.abort() fails the op in flight and the queued
  ones within milliseconds (shm waits, TCP, p2p); the instance stays for the
  next configure.
* errored: the first error of an op issued through this wrapper (from the
  op's future) or of abort(), until the next configure.
* shutdown: aborts, joins the instance's threads and drops it and its store.

Ops are tpu_dist's (every c10d collective it implements, CPU tensors).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Optional

import torch
from torch._C._distributed_c10d import ProcessGroup as BaseProcessGroup
from torch._C._distributed_c10d import ReconfigureOptions
from torch.distributed import PrefixStore, Store, TCPStore, Work

from torchft.process_group import ProcessGroupWrapper

from tpu_dist import _C

__all__ = ["ProcessGroupTpuDist"]

_LOG = logging.getLogger(__name__)

# Keys this module writes under a quorum's prefix (beside tpu_dist's own
# "tpu_dist/<group name>/..." keys).
_HANDLE_KEY = "tpu_dist_torchft/handle/"


def _split_store_addr(store_addr: str) -> tuple[str, int, str]:
    """`host:port/prefix` (host may be `[v6]`) -> (host, port, prefix)."""
    addr_part, _, prefix = store_addr.partition("/")
    host, sep, port = addr_part.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"tpu_dist.torchft: store_addr {store_addr!r} is not host:port/prefix")
    return host.strip("[]"), int(port), prefix


class ProcessGroupTpuDist(ProcessGroupWrapper):
    """A reconfigurable tpu_dist group for torchft's replica dimension.

    Args:
        timeout: the op timeout of the group and the timeout of every store
            wait during configure.
        options: knobs for the tpu_dist group (`tpu_dist.ProcessGroupTpuDist.
            Options`); the timeout and the group name are this wrapper's.
        group_name: the tpu_dist group name; default `torchft_<group rank>`
            (one group per position inside a replica group, the same name
            in every quorum so that old and new members meet).
    """

    def __init__(
        self,
        timeout: timedelta = timedelta(seconds=60),
        options: Optional[_C.ProcessGroupTpuDist.Options] = None,
        group_name: Optional[str] = None,
    ) -> None:
        super().__init__(timeout=timeout)
        self._tpu_options = options
        self._tpu_group_name = group_name
        self._backend: Optional[_C.ProcessGroupTpuDist] = None
        self._store_endpoint: Optional[tuple[str, int]] = None
        self._tcp_store: Optional[TCPStore] = None
        self._errored: Optional[Exception] = None
        self._uuid = -1
        # How many configures re-formed the kept instance / made a new one.
        self.reconfigures = 0
        self.instances_created = 0

    def getBackendName(self) -> str:
        return "torchft-tpu_dist"

    # --- torchft's ProcessGroup protocol ---------------------------------

    def configure(
        self,
        store_addr: str,
        replica_id: str,
        rank: int,
        world_size: int,
        quorum_id: Optional[int] = None,
        group_rank: Optional[int] = None,
        group_world_size: Optional[int] = None,
        global_ranks: Optional[list[int]] = None,
    ) -> None:
        self._replica_id = replica_id
        self._quorum_id = quorum_id
        self._group_rank = group_rank
        self._group_world_size = group_world_size
        self._rank = rank
        self._global_ranks = global_ranks
        self._errored = None
        self._pg = None
        host, port, prefix = _split_store_addr(store_addr)
        if self._backend is None or self._store_endpoint != (host, port):
            self._new_instance(host, port, group_rank)
        assert self._backend is not None and self._tcp_store is not None
        backend = self._backend
        store = PrefixStore(prefix, self._tcp_store)
        # Handles in rank order: this member's position is its rank.
        store.set(f"{_HANDLE_KEY}{rank}", backend.get_reconfigure_handle())
        handles = [store.get(f"{_HANDLE_KEY}{r}").decode() for r in range(world_size)]
        opts = ReconfigureOptions()
        opts.handles = handles
        opts.hints = {"store_prefix": prefix}
        opts.timeout = self._timeout
        # Fresh on every re-formation of this wrapper, as the API asks: the
        # quorum id where torchft gives one (the same on every member).
        self._uuid = max(self._uuid + 1, int(quorum_id) if quorum_id is not None else 0)
        opts.uuid = self._uuid
        try:
            backend.reconfigure(opts).wait()
        except Exception as e:  # a failed rendezvous: the next quorum retries
            self._errored = e
            raise
        self.reconfigures += 1
        pg = BaseProcessGroup(store, rank, world_size)
        pg._set_default_backend(BaseProcessGroup.BackendType.CUSTOM)
        pg._register_backend(torch.device("cpu"), BaseProcessGroup.BackendType.CUSTOM, backend)
        self._pg = pg

    def _create_pg(self, store: Store, rank: int, world_size: int) -> BaseProcessGroup:
        """A plain (non-reconfigurable) tpu_dist group over `store`, for
        callers of torchft's generic path; configure() does not use it."""
        backend = self._make_backend(store, rank, world_size, self._group_rank)
        pg = BaseProcessGroup(store, rank, world_size)
        pg._set_default_backend(BaseProcessGroup.BackendType.CUSTOM)
        pg._register_backend(torch.device("cpu"), BaseProcessGroup.BackendType.CUSTOM, backend)
        return pg

    def abort(self, errored: bool = True) -> None:
        if errored and self._errored is None:
            self._errored = RuntimeError(
                f"tpu_dist.torchft: replica {self._replica_id} rank {self._rank} "
                f"quorum {self._quorum_id}: aborted")
        if self._backend is not None:
            self._backend.abort()  # unblocks waits; the instance stays for configure
        self._pg = None

    def errored(self) -> Optional[Exception]:
        return self._errored

    def shutdown(self) -> None:
        self._drop_instance()
        self._pg = None

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout
        if self._backend is not None:
            self._backend.set_timeout(timeout)

    def _wrap_work(self, work: Work, opts: object) -> Work:
        def record(fut: torch.futures.Future) -> None:
            try:
                fut.value()
            except Exception as e:  # noqa: BLE001 - any op error means reconfigure
                if self._errored is None:
                    self._errored = e

        work.get_future().add_done_callback(record)
        return work

    # --- instances ----------------------------------------------------------

    def _make_backend(self, store: Store, rank: int, world_size: int,
                      group_rank: Optional[int]) -> _C.ProcessGroupTpuDist:
        name = self._tpu_group_name or f"torchft_{group_rank or 0}"
        return _C.ProcessGroupTpuDist(store, rank, world_size, self._timeout,
                                      group_name=name, options=self._tpu_options)

    def _new_instance(self, host: str, port: int, group_rank: Optional[int]) -> None:
        """Drops the current instance and makes a one-member group over the
        store at host:port (reconfigured onto the quorum right after)."""
        self._drop_instance()
        tcp = TCPStore(host_name=host, port=port, is_master=False,
                       wait_for_workers=False, timeout=self._timeout)
        self._backend = self._make_backend(tcp, 0, 1, group_rank)
        self._tcp_store = tcp
        self._store_endpoint = (host, port)
        self.instances_created += 1

    def _drop_instance(self) -> None:
        backend = self._backend
        self._backend = None
        self._tcp_store = None
        self._store_endpoint = None
        if backend is not None:
            try:
                backend.abort()
                backend.shutdown()
            except Exception as e:  # noqa: BLE001 - dropping it anyway
                _LOG.warning("tpu_dist.torchft: shutting down the old group: %s", e)

    def __repr__(self) -> str:
        return (f"ProcessGroupTpuDist(replica={self._replica_id}, rank={self._rank}, "
                f"quorum={self._quorum_id}, backend={self._backend})")
