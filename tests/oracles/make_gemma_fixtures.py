#!/usr/bin/env python3
"""Gemma 4 oracle fixtures, computed by HF transformers itself.

Builds a tiny random Gemma 4 text model with transformers' own
``Gemma4ForCausalLM`` shaped like E2B in every mechanism (layer pattern
sliding x4 + full, sliding window smaller than the test sequences,
head_dim != global_head_dim with partial proportional RoPE, KV-shared last
layers, double-wide MLP on the shared layers, per-layer embeddings,
layer_scalar, final logit softcap 30), with every norm weight and layer
scalar randomised (transformers initialises them to constants, which would
hide a swapped or missing norm). Writes, under ``<out>/``:

  model/                 save_pretrained directory (config.json,
                         model.safetensors in fp32, generation_config.json)
  cases.safetensors      per case (``plain``, ``right``, ``left``):
                         ``<case>.input_ids`` [B, S] int64,
                         ``<case>.attention_mask`` [B, S] int64 (absent for
                         ``plain``), ``<case>.labels`` [B, S] int64 (-100 at
                         pads), ``<case>.logits_fp32`` [B, S, V] float32,
                         ``<case>.logits_bf16`` [B, S, V] bfloat16 (HF's own
                         bf16 logits), ``<case>.loss_fp32`` / ``.loss_bf16``
                         [] float32
  generation.json        greedy generation (32 new tokens, no stop token) in
                         fp32 (HF generate with its KV cache, checked equal to
                         the no-cache argmax loop) and bf16 (no-cache loop),
                         with the smallest top-1/top-2 logit margin per run
  rope.json              inv_freq from transformers' RoPE init functions,
                         including proportional RoPE with ``factor``
  e2b_config.json        transformers' E2B text config (the kwargs of
                         convert_gemma4_weights.py's "gemma-4-e2b" variant fed
                         to this venv's Gemma4TextConfig), its per-layer
                         derived facts and every tensor name/shape of
                         Gemma4ForCausalLM(E2B) built on the meta device

Deterministic: fixed seeds, one thread. Run through regenerate.sh.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import save_file
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

SEED = 20260512
MAX_NEW_TOKENS = 32

# E2B: 35 layers [sliding x4, full] x7, last 20 KV-shared. Here: 10 layers
# [sliding x4, full] x2, last 5 KV-shared, so the shared region starts on a
# block boundary as in E2B (layer 3 is the last non-shared sliding layer,
# layer 4 the last non-shared full one; E2B: 13 and 14).
TINY_E2B_LIKE: dict[str, Any] = dict(
    vocab_size=256,
    vocab_size_per_layer_input=256,
    hidden_size=32,
    hidden_size_per_layer_input=8,
    intermediate_size=64,
    num_hidden_layers=10,
    layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=16,
    global_head_dim=32,
    num_global_key_value_heads=None,
    attention_k_eq_v=False,
    use_bidirectional_attention=None,
    num_kv_shared_layers=5,
    use_double_wide_mlp=True,
    final_logit_softcapping=30.0,
    sliding_window=4,
    max_position_embeddings=128,
    rope_parameters={
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                           "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    },
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
    tie_word_embeddings=True,
)

# transformers defines E2B only in its weight converter, which the wheel does
# not ship: src/transformers/models/gemma4/convert_gemma4_weights.py,
# _VARIANTS["gemma-4-e2b"].text_config (identical at huggingface/transformers
# commits 0f3f0632 and ca5ff0b0). Copied verbatim; everything else is this
# venv's Gemma4TextConfig defaults.
E2B_SOURCE = ("huggingface/transformers src/transformers/models/gemma4/convert_gemma4_weights.py "
              "_VARIANTS['gemma-4-e2b'].text_config @ ca5ff0b0d29a3b30277e4518644df411193f9490")
E2B_KWARGS: dict[str, Any] = dict(
    hidden_size=1536,
    hidden_size_per_layer_input=256,
    intermediate_size=4 * 1536,
    num_hidden_layers=35,
    layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7,
    num_attention_heads=8,
    num_key_value_heads=1,
    num_global_key_value_heads=None,
    attention_k_eq_v=False,
    use_bidirectional_attention=None,
    num_kv_shared_layers=20,
    use_double_wide_mlp=True,
    final_logit_softcapping=30.0,
    rope_parameters={
        "full_attention": {"rope_theta": 1_000_000.0, "rope_type": "proportional",
                           "partial_rotary_factor": 0.25},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
)


def dump_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def randomise(model: Gemma4ForCausalLM, gen: torch.Generator) -> None:
    """Replaces transformers' init: scaled normal matrices, random norms and scalars."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                # Attention scaling is 1.0: q.k of unit-RMS heads has std
                # sqrt(head_dim); small q/k norm weights keep softmax soft,
                # as trained checkpoints do, so bf16 noise stays bounded.
                p.copy_(torch.rand(p.shape, generator=gen) * 0.4 + 0.2)  # U(0.2, 0.6)
            elif name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=gen) * 1.5 + 0.5)  # U(0.5, 2.0)
            elif p.dim() == 2 and "embed_tokens" in name:
                # Embeddings N(0, 1): with the tied head the logits reach
                # |x| ~ 20-40, where the softcap 30 * tanh(x / 30) bends.
                p.copy_(torch.randn(p.shape, generator=gen))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            else:
                raise ValueError(f"unexpected parameter {name} {tuple(p.shape)}")
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(torch.rand(b.shape, generator=gen) * 1.3 + 0.2)  # U(0.2, 1.5)


def make_cases(gen: torch.Generator, vocab: int) -> dict[str, dict[str, torch.Tensor]]:
    """Input batches: no mask, right-padded and left-padded (same rows)."""
    seq = 12  # > sliding_window (4) and > the 8 of the full-layer RoPE period check
    lengths = [12, 9, 5]
    rows = [torch.cat([torch.tensor([2]), torch.randint(3, vocab, (n - 1,), generator=gen)]) for n in lengths]
    plain = torch.cat([torch.tensor([[2], [2]]), torch.randint(3, vocab, (2, 15), generator=gen)], dim=1)
    cases: dict[str, dict[str, torch.Tensor]] = {"plain": {"input_ids": plain, "labels": plain.clone()}}
    for side in ("right", "left"):
        ids = torch.zeros(len(rows), seq, dtype=torch.int64)
        mask = torch.zeros(len(rows), seq, dtype=torch.int64)
        for i, r in enumerate(rows):
            sl = slice(0, len(r)) if side == "right" else slice(seq - len(r), seq)
            ids[i, sl] = r
            mask[i, sl] = 1
        labels = ids.masked_fill(mask == 0, -100)
        cases[side] = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    return cases


def run_case(model: Gemma4ForCausalLM, case: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        out = model(input_ids=case["input_ids"], attention_mask=case.get("attention_mask"),
                    labels=case["labels"], use_cache=False)
    return out.logits, out.loss


def greedy_no_cache(model: Gemma4ForCausalLM, prompt: torch.Tensor) -> tuple[list[int], float]:
    """Argmax loop re-running the whole sequence (our GreedyGenerate's method)."""
    seq = prompt.clone()
    margin = float("inf")
    with torch.no_grad():
        for _ in range(MAX_NEW_TOKENS):
            last = model(input_ids=seq, use_cache=False).logits[0, -1].float()
            top = torch.topk(last, 2).values
            margin = min(margin, float(top[0] - top[1]))
            seq = torch.cat([seq, last.argmax().view(1, 1)], dim=1)
    return seq[0, prompt.shape[1]:].tolist(), margin


def greedy_hf_generate(model: Gemma4ForCausalLM, prompt: torch.Tensor) -> list[int]:
    with torch.no_grad():
        out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                             max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0, use_cache=True)
    return out[0, prompt.shape[1]:].tolist()


def rope_fixture() -> dict[str, Any]:
    """inv_freq of transformers' own Gemma4TextRotaryEmbedding, per layer type."""
    specs = [
        ("full_attention", 32, {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                "rope_theta": 1_000_000.0}),
        ("full_attention", 512, {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                 "rope_theta": 1_000_000.0}),
        ("full_attention", 64, {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                "rope_theta": 1_000_000.0, "factor": 8.0}),
        ("full_attention", 40, {"rope_type": "proportional", "partial_rotary_factor": 0.3,
                                "rope_theta": 50_000.0, "factor": 2.5}),
        ("sliding_attention", 32, {"rope_type": "default", "rope_theta": 10_000.0}),
    ]
    out = []
    for layer_type, global_head_dim, params in specs:
        rope = dict(TINY_E2B_LIKE["rope_parameters"], **{layer_type: params})
        config = Gemma4TextConfig(**{**TINY_E2B_LIKE, "global_head_dim": global_head_dim, "rope_parameters": rope})
        inv = getattr(Gemma4ForCausalLM(config).model.rotary_emb, f"{layer_type}_inv_freq").tolist()
        head_dim = config.per_layer_config[layer_type].head_dim
        out.append({"layer_type": layer_type, "head_dim": head_dim, "rope_parameters": params,
                    "inv_freq": [float(x) for x in inv], "inv_freq_hex": [float(x).hex() for x in inv]})
    return {"cases": out, "transformers_version": transformers.__version__}


def e2b_fixture() -> dict[str, Any]:
    config = Gemma4TextConfig(**E2B_KWARGS)
    with torch.device("meta"):
        model = Gemma4ForCausalLM(config)
    layers = model.model.layers
    modes = config.kv_sharing_modes
    tensors = {n: list(p.shape) for n, p in model.state_dict().items() if n != "lm_head.weight"}
    d = config.to_dict()
    return {
        "source": E2B_SOURCE,
        "transformers_version": transformers.__version__,
        "config": {k: d[k] for k in sorted(d) if k not in ("transformers_version", "id2label", "label2id")},
        "per_layer": {
            "head_dim": [layers[i].self_attn.head_dim for i in range(len(layers))],
            "num_key_value_heads": [config.num_attention_heads // layers[i].self_attn.num_key_value_groups
                                    for i in range(len(layers))],
            "intermediate_size": [layers[i].mlp.intermediate_size for i in range(len(layers))],
            "kv_sharing_mode": modes,
            "is_sliding": [layers[i].self_attn.is_sliding for i in range(len(layers))],
            "sliding_window": [layers[i].self_attn.sliding_window for i in range(len(layers))],
            "scaling": [layers[i].self_attn.scaling for i in range(len(layers))],
        },
        "embed_scale": float(model.model.embed_tokens.scalar_embed_scale),
        "tensors": tensors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="fixture directory (replaced)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    transformers.logging.set_verbosity_error()
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    gen = torch.Generator().manual_seed(SEED)
    config = Gemma4TextConfig(**TINY_E2B_LIKE)
    config._attn_implementation = "eager"
    model = Gemma4ForCausalLM(config).eval()
    randomise(model, gen)
    model_dir = out / "model"
    model.save_pretrained(model_dir, safe_serialization=True)

    # Reload both precisions the way a user does (from_pretrained keeps the
    # RoPE inv_freq buffers in fp32 under dtype=bfloat16).
    fp32 = Gemma4ForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    bf16 = Gemma4ForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="eager").eval()
    for name, b in bf16.named_buffers():
        if name.endswith("inv_freq"):
            assert b.dtype == torch.float32, (name, b.dtype)

    cases = make_cases(gen, config.vocab_size)
    tensors: dict[str, torch.Tensor] = {}
    summary: dict[str, Any] = {}
    for name, case in cases.items():
        logits32, loss32 = run_case(fp32, case)
        logits16, loss16 = run_case(bf16, case)
        assert logits16.dtype == torch.bfloat16
        for k, v in case.items():
            tensors[f"{name}.{k}"] = v.contiguous()
        tensors[f"{name}.logits_fp32"] = logits32.contiguous()
        tensors[f"{name}.logits_bf16"] = logits16.contiguous()
        tensors[f"{name}.loss_fp32"] = loss32.float().reshape(())
        tensors[f"{name}.loss_bf16"] = loss16.float().reshape(())
        summary[name] = {"max_abs_logit": float(logits32.abs().max()),
                         "max_abs_fp32_vs_bf16": float((logits32 - logits16.float()).abs().max()),
                         "loss_fp32": float(loss32), "loss_bf16": float(loss16)}
    save_file(tensors, str(out / "cases.safetensors"), metadata={"format": "pt"})

    prompt = torch.cat([torch.tensor([[2]]), torch.randint(3, config.vocab_size, (1, 5), generator=gen)], dim=1)
    fp32_tokens, fp32_margin = greedy_no_cache(fp32, prompt)
    fp32_generate = greedy_hf_generate(fp32, prompt)
    assert fp32_generate == fp32_tokens, (fp32_generate, fp32_tokens)
    bf16_tokens, bf16_margin = greedy_no_cache(bf16, prompt)
    dump_json(out / "generation.json", {
        "prompt": prompt[0].tolist(),
        "max_new_tokens": MAX_NEW_TOKENS,
        "fp32": {"tokens": fp32_tokens, "min_top2_margin": fp32_margin,
                 "method": "model.generate(do_sample=False, use_cache=True), equal to the no-cache argmax loop"},
        "bf16": {"tokens": bf16_tokens, "min_top2_margin": bf16_margin,
                 "method": "no-cache argmax loop (full forward per step)"},
    })
    dump_json(out / "rope.json", rope_fixture())
    dump_json(out / "e2b_config.json", e2b_fixture())
    dump_json(out / "summary.json", {"transformers_version": transformers.__version__,
                                     "torch_version": torch.__version__.split("+")[0], "seed": SEED,
                                     "cases": summary})


if __name__ == "__main__":
    main()
