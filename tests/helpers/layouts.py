"""The layouts archlab's presets compose, shrunk to a few thousand parameters: GPT-2, LLaMA, Gemma 3, Qwen3,
a MoE (Qwen3-MoE), MLA (DeepSeek-V2-Lite), a Gated DeltaNet hybrid (Qwen3-Next) and Mamba-2 (Codestral),
each at any width with every inner width following d_model (heads × head dim, d_ff, expert widths, MLA's
ranks, the Gated DeltaNet heads), as μP's rules take a width sweep to grow them; for the parametrisation
tests."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from archlab import compose_model
from archlab.config import ModelConfig
from archlab.nn.validation import validate

SMALL = ["model.vocab_size=64", "model.context_length=32", "model.n_layer=2", "model.dropout=0.0"]
MOE = ["model.mlp.d_ff=null", "model.mlp.expert_d_ff=null", "model.mlp.routing.n_experts=4"]
MOE += ["model.mlp.routing.top_k=2"]
# name -> (overrides, {field path: its width as a fraction of d_model}): the fields a preset fixes that a
# width sweep must grow with d_model (the rest follow d_model by their own rules)
LAYOUTS: dict[str, tuple[list[str], dict[str, float]]] = {
    "gpt2": (["model=gpt2", "model.attention.n_head=2"], {}),
    "llama": (
        ["model=llama3-8b", "model.attention.n_head=4", "model.attention.n_kv_head=2", "model.mlp.multiple_of=8"],
        {},
    ),
    "gemma": (
        [
            "model=gemma3-1b",
            "model.attention.n_head=2",
            "model.attention.head_dim=null",
            "model.attention.scale=null",
            "model.mlp.d_ff=null",
            "model.layers.kinds.local.attention.window=8",
            "model.layers.pattern=[local,global]",
        ],
        {},
    ),
    "qwen3": (
        [
            "model=qwen3-0.6b",
            "model.attention.n_head=4",
            "model.attention.n_kv_head=2",
            "model.attention.head_dim=null",
            "model.mlp.d_ff=null",
        ],
        {},
    ),
    "moe": (
        ["model=qwen3-30b-a3b", "model.attention.n_head=4", "model.attention.n_kv_head=2"]
        + ["model.attention.head_dim=null", *MOE],
        {},
    ),
    "mla": (
        ["model=deepseek-v2-lite", "model.attention.n_head=2", *MOE],
        {
            "attention.kv_lora_rank": 1 / 2,
            "attention.qk_nope_head_dim": 1 / 4,
            "attention.qk_rope_head_dim": 1 / 4,
            "attention.v_head_dim": 1 / 2,
        },
    ),
    "gated_deltanet": (
        ["model=qwen3-next-80b-a3b", "model.attention.n_head=2", "model.attention.n_kv_head=1"]
        + ["model.attention.head_dim=null", "model.layers.pattern=[deltanet,attention]", *MOE]
        + ["model.layers.kinds.deltanet.attention.n_head=2", "model.layers.kinds.deltanet.attention.key_heads=2"],
        {
            "layers.kinds.deltanet.attention.key_head_dim": 1 / 2,
            "layers.kinds.deltanet.attention.v_head_dim": 1 / 2,
        },
    ),
    "mamba2": (
        ["model=mamba-codestral-7b", "model.attention.n_head=2", "model.attention.head_dim=null"]
        + ["model.attention.state_size=16", "model.attention.groups=1", "model.attention.scan_chunk=16"],
        {},
    ),
}


@functools.cache
def _composed(name: str) -> ModelConfig:
    overrides, _ = LAYOUTS[name]
    return compose_model([*overrides[:1], *SMALL, *overrides[1:]])


def _set(section: Any, path: list[str], value: int) -> Any:
    """``section`` (a config dataclass or a layer kind's dict) with the field at ``path`` set to ``value``."""
    head, *rest = path
    if isinstance(section, dict):
        return {**section, head: _set(section.get(head, {}), rest, value) if rest else value}
    return dataclasses.replace(section, **{head: _set(getattr(section, head), rest, value) if rest else value})


def layout(name: str, d_model: int = 32, n_layer: int = 2) -> ModelConfig:
    """Layout ``name`` at ``d_model`` and ``n_layer``, its inner widths following d_model, validated."""
    cfg = dataclasses.replace(_composed(name), d_model=d_model, n_layer=n_layer)
    for path, fraction in LAYOUTS[name][1].items():
        cfg = _set(cfg, path.split("."), int(d_model * fraction))
    return validate(cfg)
