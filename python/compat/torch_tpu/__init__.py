"""A stand-in for TorchTPU's `torch_tpu` package, for Ray Train on CPU hosts.

NOT TorchTPU. Never put this directory on sys.path where the real torch_tpu
is installed: it would shadow it.

Why it exists: Ray Train (2.60) picks its TPU code path from the `TPU`
resource a worker holds, and on that path
- `TorchConfig(backend="tpu_dist")` calls `torch_tpu._loader.load()` to make
  the backend known to torch.distributed before `init_process_group`
  (ray/train/torch/config.py, ray/air/_internal/device_manager/__init__.py);
- its TPU device manager checks `import torch_tpu` and names the worker's
  device `torch.device("tpu")` (ray/air/_internal/device_manager/tpu.py),
  which `ray.train.torch.get_device()` returns and Ray Train's worker setup
  reads.

On a real TPU host torch_tpu provides both: the "tpu_dist" backend and a
"tpu" device with kernels. Here the backend is this project's `tpu_dist`
package, and "tpu" is only a name: importing this module renames torch's
PrivateUse1 device type to "tpu" so that `torch.device("tpu")` parses, and
registers `torch.tpu` (this package's `device` module) saying that no such
device is available (is_available() False, device_count() 0), which is what
torch's accelerator queries (e.g. in torch.optim) then see. No kernel is
registered; tensors stay on the CPU, and programs must use device "cpu"
(examples/ray/ray_train_llm_finetune.py passes `move_to_device=False` to
Ray's data loader for that reason).

Ray is not patched: it imports this module exactly as it would import
TorchTPU's.
"""

from __future__ import annotations

import torch

__all__ = ["DEVICE_TYPE", "is_standin"]

DEVICE_TYPE = "tpu"


def is_standin() -> bool:
    """True: this is tpu_dist's stand-in, not TorchTPU."""
    return True


def _name_device() -> None:
    # PrivateUse1 can be renamed once per process; a second import (or another
    # library that named it "tpu") is fine, any other name is a conflict.
    current = torch._C._get_privateuse1_backend_name()
    if current == DEVICE_TYPE:
        return
    if current != "privateuseone":
        raise ImportError(
            f"torch_tpu (tpu_dist stand-in): torch's PrivateUse1 device is already "
            f"named {current!r}; cannot name it {DEVICE_TYPE!r}")
    torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
    from torch_tpu import device

    torch._register_device_module(DEVICE_TYPE, device)


_name_device()
