"""The safetensors package as the oracle for io/safetensors.h (run by io_test).

  python safetensors_oracle.py write PATH   # save the expected tensors with safetensors.torch
  python safetensors_oracle.py check PATH   # load PATH with safetensors, compare with the expected ones

The expected tensors are a formula per name, written out identically in
io/safetensors_oracle_test.cc; "check" exits 1 naming the first difference.
"""
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file

FLOATS = {"f64": (torch.float64, [2, 3]), "f32": (torch.float32, [3, 5]),
          "f16": (torch.float16, [2, 2]), "bf16": (torch.bfloat16, [7])}
INTS = {"i64": (torch.int64, [2, 3]), "i32": (torch.int32, [4]),
        "i16": (torch.int16, [4]), "i8": (torch.int8, [4])}
METADATA = {"format": "pt", "oracle": "safetensors"}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def expected():
    out = {}
    for name, (dtype, shape) in FLOATS.items():
        out[name] = (torch.arange(numel(shape), dtype=torch.float64) * 0.5 - 1).to(dtype).reshape(shape)
    for name, (dtype, shape) in INTS.items():
        out[name] = (torch.arange(numel(shape), dtype=torch.int64) - 3).to(dtype).reshape(shape)
    out["u8"] = (torch.arange(5, dtype=torch.int64) * 50).to(torch.uint8)
    out["bool"] = torch.arange(5) % 2 == 0
    out["scalar"] = torch.tensor(2.5, dtype=torch.float32)
    out["empty"] = torch.zeros(0, 4, dtype=torch.float32)
    out["strided"] = torch.arange(24, dtype=torch.float32).reshape(4, 6).t().contiguous()
    return out


def main():
    mode, path = sys.argv[1], sys.argv[2]
    want = expected()
    if mode == "write":
        save_file(want, path, metadata=METADATA)
        return 0
    with safe_open(path, framework="pt") as f:
        if f.metadata() != METADATA:
            print(f"{path}: metadata {f.metadata()} != {METADATA}")
            return 1
        names = set(f.keys())
        if names != set(want):
            print(f"{path}: tensors {sorted(names)} != {sorted(want)}")
            return 1
        for name, w in want.items():
            got = f.get_tensor(name)
            if got.dtype != w.dtype or list(got.shape) != list(w.shape) or not torch.equal(got, w):
                print(f"{path}: tensor {name!r}: got {got.dtype} {list(got.shape)} {got}, want {w.dtype} {list(w.shape)} {w}")
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
