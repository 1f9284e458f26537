"""Arcee AFM (``ArceeForCausalLM``): LLaMA's layers with a plain MLP, ``down(act(up(x)))`` without a gate,
the squared ReLU as published (archlab's ``mlp.kind: relu2``); and the activation names of such MLPs,
which Nemotron's share."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family
from archlab.interop.families.llama import Llama
from archlab.interop.families.mlps import PLAIN_FROM_HF, PLAIN_TO_HF, activation, mlp_section
from archlab.interop.families.tensors import Tensors
from archlab.interop.families.values import refuse_hf

# up/down MLPs compute down(act(up(x))): hidden_act <-> archlab (kind, approximate)
UP_DOWN_FROM_HF = {**PLAIN_FROM_HF, "relu2": ("relu2", "none")}
UP_DOWN_TO_HF = {**PLAIN_TO_HF, ("relu2", "none"): "relu2"}
UP_DOWN_KINDS = ("relu2", "gelu", "relu")


def up_down_mlp(c: Any) -> Any:
    """down(act(up(x))), biases as ``mlp_bias`` says, its activation read from ``hidden_act``."""
    if c.hidden_act not in UP_DOWN_FROM_HF:
        refuse_hf(c, "hidden_act", f"one of {sorted(UP_DOWN_FROM_HF)}")
    kind, approximate = UP_DOWN_FROM_HF[c.hidden_act]
    return mlp_section(kind, d_ff=c.intermediate_size, bias=bool(c.mlp_bias), approximate=approximate)


def up_down_tensors(t: Tensors, archlab: str, hf: str) -> None:
    """archlab's plain MLP (``fc``, ``proj``) as ``up_proj``, ``down_proj``."""
    t.add(f"{archlab}.fc", f"{hf}.up_proj", t.cfg.mlp.bias)
    t.add(f"{archlab}.proj", f"{hf}.down_proj", t.cfg.mlp.bias)


class Arcee(Llama):
    """ArceeForCausalLM: LLaMA's names, norms, RoPE and biases (``attention_bias``, ``mlp_bias``), its MLP
    ``up_proj`` then ``down_proj`` around a plain activation."""

    model_type, title, model_class, config_class = "arcee", "Arcee AFM", "ArceeForCausalLM", "ArceeConfig"
    parts = "LLaMA's layers with a plain up/down MLP (ReLU², GELU or ReLU) in place of the gated one"
    mlp_kinds = UP_DOWN_KINDS
    mlp_why = " (its MLP is up_proj, then down_proj, without a gate)"

    def activation_to_hf(self, cfg: ModelConfig) -> str:
        return UP_DOWN_TO_HF[activation(cfg.mlp)]

    def mlp_from_hf(self, c: Any) -> Any:
        return up_down_mlp(c)

    def mlp_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        up_down_tensors(t, archlab, hf)


RECORDS: tuple[Family, ...] = (Arcee(),)
