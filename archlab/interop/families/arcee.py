"""Arcee AFM (``ArceeForCausalLM``): LLaMA's layers with a plain MLP, ``down(act(up(x)))`` without a gate,
the squared ReLU as published (archlab's ``mlp.kind: relu2``); and the activation names of such MLPs,
which Nemotron's share."""

from __future__ import annotations

from typing import Any

from archlab.interop.families.base import Family
from archlab.interop.families.llama import Llama, MLPForm
from archlab.interop.families.mlps import PLAIN_FROM_HF, PLAIN_TO_HF, mlp_section
from archlab.interop.families.tensors import Tensors
from archlab.interop.families.values import refuse_hf

# up/down MLPs compute down(act(up(x))): hidden_act <-> archlab (kind, approximate)
UP_DOWN_FROM_HF = {**PLAIN_FROM_HF, "relu2": ("relu2", "none")}
UP_DOWN_TO_HF = {**PLAIN_TO_HF, ("relu2", "none"): "relu2"}
UP_DOWN_KINDS = ("relu2", "gelu", "relu")


def up_down_mlp(c: Any, act: str = "hidden_act") -> Any:
    """down(act(up(x))), biases as ``mlp_bias`` says, its activation read from the config key ``act``."""
    name = getattr(c, act)
    if name not in UP_DOWN_FROM_HF:
        refuse_hf(c, act, f"one of {sorted(UP_DOWN_FROM_HF)}")
    kind, approximate = UP_DOWN_FROM_HF[name]
    return mlp_section(kind, d_ff=c.intermediate_size, bias=bool(c.mlp_bias), approximate=approximate)


def up_down_tensors(t: Tensors, archlab: str, hf: str) -> None:
    """archlab's plain MLP (``fc``, ``proj``) as ``up_proj``, ``down_proj``."""
    t.add(f"{archlab}.fc", f"{hf}.up_proj", t.cfg.mlp.bias)
    t.add(f"{archlab}.proj", f"{hf}.down_proj", t.cfg.mlp.bias)


# the up/down MLP of LLaMA-style families (``llama.MLPForm``): Arcee's and Jais 2's
UP_DOWN = MLPForm(
    UP_DOWN_KINDS, " (its MLP is up_proj, then down_proj, without a gate)", UP_DOWN_TO_HF, up_down_mlp, up_down_tensors
)


class Arcee(Llama):
    """ArceeForCausalLM: LLaMA's names, norms, RoPE and biases (``attention_bias``, ``mlp_bias``), its MLP
    ``up_proj`` then ``down_proj`` around a plain activation."""

    model_type, title, model_class, config_class = "arcee", "Arcee AFM", "ArceeForCausalLM", "ArceeConfig"
    parts = "LLaMA's layers with a plain up/down MLP (ReLU², GELU or ReLU) in place of the gated one"
    mlp_form = UP_DOWN


RECORDS: tuple[Family, ...] = (Arcee(),)
