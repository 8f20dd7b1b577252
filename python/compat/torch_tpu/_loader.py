"""`torch_tpu._loader.load()`: what Ray Train calls before init_process_group
with backend "tpu_dist". Here it registers this project's tpu_dist backend."""

from __future__ import annotations


def load() -> None:
    """Registers the "tpu_dist" torch.distributed backend (idempotent)."""
    import tpu_dist  # noqa: F401  (registration happens at import)
