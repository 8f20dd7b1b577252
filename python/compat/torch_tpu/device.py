"""`torch.tpu` under the stand-in torch_tpu: there is no TPU on this host."""

from __future__ import annotations


def is_available() -> bool:
    """No TPU device here (tensors stay on the CPU)."""
    return False


def device_count() -> int:
    return 0


def _is_in_bad_fork() -> bool:
    return False


def manual_seed_all(seed: int) -> None:
    """torch.manual_seed calls this for the "tpu" device: no device, nothing to seed."""
    del seed
