"""Nemotron-H's MoE layers both ways (``nemotron_h``; Nemotron 3's layouts): sigmoid top-k of up/down experts
with a selection-only correction bias, expert groups and a routed scale, beside shared up/down experts (no
latent projection): its config keys, rules and reading, its experts saved apart and stacked on loading, and
its tensors."""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import torch
from torch import Tensor

from archlab.config import ModelConfig
from archlab.interop.families.arcee import UP_DOWN_KINDS
from archlab.interop.families.base import Rule
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.moe import expert_width

MOE_KEYS = {  # HF key -> the field of archlab's MoE section
    "n_routed_experts": "routing.n_experts",
    "num_experts_per_tok": "routing.top_k",
    "moe_intermediate_size": "expert_d_ff",
    "n_group": "routing.n_groups",
    "topk_group": "routing.top_groups",
    "norm_topk_prob": "routing.normalize_top_k",
    "routed_scaling_factor": "routing.routed_scale",
}


def moe_rules() -> list[Rule]:
    """What its MoE layers require: up/down experts without biases, sigmoid scores with the correction bias."""
    return [
        ("model.mlp.expert", UP_DOWN_KINDS, " (its experts are up_proj, then down_proj, without a gate)"),
        ("model.mlp.bias", (False,), " (its experts have no biases; mlp_bias sets the shared experts')"),
        ("model.mlp.routing.scoring", ("sigmoid",), ""),
        ("model.mlp.routing.correction_bias", (True,), " (its router always has e_score_correction_bias)"),
    ]


def moe_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The keys of its MoE layers: ``MOE_KEYS``' and the shared experts' width; no latent projection."""
    m = cfg.mlp
    moe = {key: attrgetter(field)(m) for key, field in MOE_KEYS.items()}
    moe.update(moe_shared_expert_intermediate_size=m.n_shared_experts * expert_width(cfg), moe_latent_size=None)
    return moe


def moe_from_hf(c: Any, dense: Any) -> Any:
    """The MoE of the config's ``moe`` layers: ``dense``'s activation for its experts, sigmoid scores with
    the correction bias, the shared experts as n experts of the routed width."""
    if c.moe_latent_size is not None:
        refuse_hf(c, "moe_latent_size", "null (archlab's experts read and write d_model: no latent projection)")
    n, rest = divmod(c.moe_shared_expert_intermediate_size, c.moe_intermediate_size)
    if rest or n < 1:
        allowed = "a positive multiple of moe_intermediate_size (archlab's shared experts: n of the routed width)"
        refuse_hf(c, "moe_shared_expert_intermediate_size", allowed)
    fields = {field.removeprefix("routing."): getattr(c, key) for key, field in MOE_KEYS.items()}
    fields.update(routed_scale=float(fields["routed_scale"]), normalize_top_k=bool(fields["normalize_top_k"]))
    return mlp_section(
        "moe",
        expert=dense.kind,
        approximate=getattr(dense, "approximate", "none"),  # a GELU kind's form; the others have none
        d_ff=dense.d_ff,
        bias=dense.bias,
        n_shared_experts=n,
        **fields,
        routing=dict(scoring="sigmoid", correction_bias=True),
    )


def stack_up_down_experts(cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Each MoE layer's experts, saved one tensor per expert and matrix (``mixer.experts.e.up_proj.weight``),
    stacked as transformers holds them (``mixer.experts.up_proj`` [E, f, d]) where every expert is there."""
    E = cfg.mlp.routing.n_experts
    layers = {k.split(".mixer.experts.")[0] for k in state if ".mixer.experts." in k}
    for h in layers:
        for m in ("up_proj", "down_proj"):
            names = [f"{h}.mixer.experts.{e}.{m}.weight" for e in range(E)]
            if all(n in state for n in names):
                state[f"{h}.mixer.experts.{m}"] = torch.stack([state.pop(n) for n in names])
    return state


def moe_tensors(t: Tensors, archlab: str, hf: str) -> None:
    """A MoE layer: the router (``gate``) and its correction bias, the stacked up/down experts, the shared
    experts' up_proj and down_proj."""
    t.add(f"{archlab}.router", f"{hf}.gate")
    t.maps.append(TensorMap(f"{archlab}.router_bias", (f"{hf}.gate.e_score_correction_bias",)))
    t.maps.append(TensorMap(f"{archlab}.experts.fc", (f"{hf}.experts.up_proj",)))
    t.maps.append(TensorMap(f"{archlab}.experts.proj", (f"{hf}.experts.down_proj",)))
    t.add(f"{archlab}.shared.fc", f"{hf}.shared_experts.up_proj")
    t.add(f"{archlab}.shared.proj", f"{hf}.shared_experts.down_proj")
