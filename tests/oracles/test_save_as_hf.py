"""Our SaveGemmaAsHf output, read by transformers' own from_pretrained.

Runs ``gemma_test --gtest_filter=HfOracleExport.*`` (models/gemma/
hf_oracle_test.cc), which loads the tiny E2B-shaped fixture model with our
loader and saves it with SaveGemmaAsHf four ways (gemma4 wrapper fp32, bare
gemma4_text fp32, wrapper converted to bf16 on save, and a bf16 model saved
as is) plus its own logits. Each directory must load through
AutoModelForCausalLM with no missing, unexpected or mismatched keys and no
loading warnings, in the dtype config.json names, and give the fixture's
transformers logits (fp32: max abs difference <= 1e-5; bf16: equal to within
one bf16 ulp of the logit).

The binary is $TPU_DIST_GEMMA_TEST, else build/models/gemma/gemma_test; the
test is skipped when neither exists (run it after building gemma_test).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[2]
# ctest's oracle_fixtures regenerates the fixtures on the CPU that runs the test
# ($TPU_DIST_ORACLE_FIXTURES): the committed floats are exact only for the
# kernels of the CPU they were made on (an Intel AMX Xeon's fp32 logits differ
# from the committed AMD ones by up to 1e-4).
_FRESH = os.environ.get("TPU_DIST_ORACLE_FIXTURES")
FIXTURES = Path(_FRESH) / "gemma" if _FRESH else Path(__file__).resolve().parent / "fixtures" / "gemma"
BINARY = Path(os.environ.get("TPU_DIST_GEMMA_TEST", REPO / "build" / "models" / "gemma" / "gemma_test"))
CASES = ("plain", "right", "left")
EXPORTS = {  # directory -> (architecture, dtype the weights are stored in)
    "wrapper_fp32": ("Gemma4ForConditionalGeneration", torch.float32),
    "text_fp32": ("Gemma4ForCausalLM", torch.float32),
    "wrapper_bf16_converted": ("Gemma4ForConditionalGeneration", torch.bfloat16),
    "wrapper_bf16_native": ("Gemma4ForConditionalGeneration", torch.bfloat16),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not BINARY.exists():
        pytest.skip(f"{BINARY} not built")
    out = tmp_path_factory.mktemp("save_as_hf")
    env = dict(os.environ, TPU_DIST_ORACLE_EXPORT_DIR=str(out), TPU_DIST_SOURCE_DIR=str(REPO))
    proc = subprocess.run([str(BINARY), "--gtest_filter=HfOracleExport.*"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "[  PASSED  ] 1 test" in proc.stdout, proc.stdout[-4000:]
    return out


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_transformers_loads_our_checkpoint(exported: Path, name: str) -> None:
    architecture, dtype = EXPORTS[name]
    directory = exported / name
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == [architecture]
    want_dtype = "bfloat16" if dtype == torch.bfloat16 else "float32"
    assert config["dtype"] == want_dtype
    if "text_config" in config:
        assert config["text_config"]["dtype"] == want_dtype

    capture = _Capture()
    hf_logger = transformers.logging.get_logger("transformers")
    hf_logger.addHandler(capture)
    transformers.logging.set_verbosity_warning()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(directory, dtype="auto", attn_implementation="eager",
                                                           output_loading_info=True)
    finally:
        hf_logger.removeHandler(capture)
        transformers.logging.set_verbosity_error()
    assert type(model).__name__ == architecture
    assert model.dtype == dtype
    assert not info["missing_keys"], info
    assert not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    assert not info.get("error_msgs"), info
    assert not capture.messages, capture.messages

    model.eval()
    cases = load_file(str(FIXTURES / "cases.safetensors"))
    ours = load_file(str(exported / "ours.safetensors"))
    for case in CASES:
        ids = cases[f"{case}.input_ids"]
        mask = cases.get(f"{case}.attention_mask")
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        if dtype == torch.float32:
            want = cases[f"{case}.logits_fp32"]
            assert (logits - want).abs().max().item() <= 1e-5, (name, case)
            assert (ours[f"{case}.fp32"] - want).abs().max().item() <= 1e-5, (name, case)
        else:
            want = cases[f"{case}.logits_bf16"].float()
            assert ((logits - want).abs() - want.abs() / 128).max().item() <= 0, (name, case)
            assert ((ours[f"{case}.bf16"] - want).abs() - want.abs() / 128).max().item() <= 0, (name, case)
