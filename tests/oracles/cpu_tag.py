"""The CPU features that pick torch's CPU kernels, as a fixture tag.

Fixture floats are exact only for one kernel path: the same torch build takes
different MKL / oneDNN / ATen vectorised code on an AVX2-only CPU than on one
with AVX-512 (BF16, VNNI) or AMX, and the last bits of sums and GEMMs move.
`regenerate.sh` records this tag next to the fixtures (`cpu.json`);
`test_fixtures_fresh.py` demands byte-identical files only when the tag of
the machine it runs on equals the committed one.

    python cpu_tag.py OUT.json    # writes {"isa": [...], "model": "..."}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Flags (as /proc/cpuinfo spells them) that change which kernels torch runs.
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_tag(cpuinfo: str | None = None) -> dict[str, object]:
    """The kernel-relevant flags and model name of this CPU (first processor)."""
    text = cpuinfo if cpuinfo is not None else Path("/proc/cpuinfo").read_text()
    flags: set[str] = set()
    model = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = set(value.split())
        elif key == "model name" and not model:
            model = value.strip()
    return {"isa": [f for f in KERNEL_FLAGS if f in flags], "model": model}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: cpu_tag.py OUT.json", file=sys.stderr)
        return 2
    Path(argv[1]).write_text(json.dumps(cpu_tag(), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
