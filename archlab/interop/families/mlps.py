"""The MLPs both ways: transformers' activation names of plain and gated MLPs against archlab's (kind,
approximate), archlab's MLP section of a config's fields (``mlp_section``), and what a record reads of a
section (its activation, its shared experts, a mixture of experts' dense form)."""

from __future__ import annotations

import dataclasses
from typing import Any

from archlab.config import MLP_OPTIONS, ModelConfig
from archlab.errors import ConfigError
from archlab.interop.families.values import refuse_hf
from archlab.nn.moe import RoutingConfig

# Plain MLPs compute act(fc(x)): transformers activation <-> archlab (kind, approximate).
PLAIN_FROM_HF = {
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "gelu": ("gelu", "none"),
    "relu": ("relu", "none"),
}
PLAIN_TO_HF = {("gelu", "tanh"): "gelu_new", ("gelu", "none"): "gelu", ("relu", "none"): "relu"}
# Gated MLPs compute down(act(gate(x)) * up(x)): hidden_act <-> archlab (kind, approximate).
GATED_FROM_HF = {
    "silu": ("swiglu", "none"),
    "gelu": ("geglu", "none"),
    "gelu_pytorch_tanh": ("geglu", "tanh"),
    "gelu_new": ("geglu", "tanh"),
}
GATED_TO_HF = {("swiglu", "none"): "silu", ("geglu", "none"): "gelu", ("geglu", "tanh"): "gelu_pytorch_tanh"}


ROUTING_FIELDS = frozenset(f.name for f in dataclasses.fields(RoutingConfig))


def mlp_section(kind: str, approximate: str = "none", **fields: Any) -> Any:
    """archlab's MLP of ``kind`` with ``fields``, written flat as a Hugging Face config holds them (a
    mixture of experts' router fields go under ``routing``): the form of the activation Hugging Face's
    name gave, ``approximate``, kept where the kind has that field (GELU's kinds, a mixture of experts);
    the other kinds have no tanh form to hold."""
    routing = {**fields.pop("routing", {}), **{k: fields.pop(k) for k in list(fields) if k in ROUTING_FIELDS}}
    if routing:
        fields["routing"] = routing
    if "approximate" in MLP_OPTIONS.fields(kind):
        fields["approximate"] = approximate
    elif approximate != "none":
        raise ConfigError("model.mlp.approximate", approximate, f"none for {kind} (it has no tanh form)")
    return MLP_OPTIONS.make(kind=kind, **fields)


def activation(mlp: Any) -> tuple[str, str]:
    """The activation an MLP section runs, as the tables to Hugging Face's names key it: (kind, approximate),
    a mixture of experts' its experts' kind; "none" where the kind has no tanh form."""
    return (mlp.expert if mlp.kind == "moe" else mlp.kind), getattr(mlp, "approximate", "none")


def shared_experts(mlp: Any) -> int:
    """A mixture of experts' shared experts; none for a dense MLP."""
    return mlp.n_shared_experts if mlp.kind == "moe" else 0


def dense_of(mlp: Any) -> Any:
    """A mixture of experts' section as one dense MLP of its experts' kind, with the fields they share (what
    its dense layers are); a dense section as it is."""
    return MLP_OPTIONS.build({"kind": mlp.expert}, "model.mlp", base=mlp) if mlp.kind == "moe" else mlp


def plain_mlp(c: Any, act: str, width: int) -> Any:
    """act(fc(x)) with biases, its activation read from the config key ``act``."""
    name = getattr(c, act)
    if name not in PLAIN_FROM_HF:
        refuse_hf(c, act, f"one of {sorted(PLAIN_FROM_HF)}")
    kind, approximate = PLAIN_FROM_HF[name]
    return mlp_section(kind, d_ff=width, bias=True, approximate=approximate)


def gated_activation(c: Any, act: str = "hidden_act") -> tuple[str, str]:
    """archlab's (kind, approximate) of a gated MLP's activation, read from the config key ``act``;
    refused, naming it, where archlab has no such gated kind."""
    name = getattr(c, act)
    if name not in GATED_FROM_HF:
        refuse_hf(c, act, f"one of {sorted(GATED_FROM_HF)}")
    return GATED_FROM_HF[name]


def gated_mlp(c: Any, act: str) -> Any:
    """down(act(gate(x)) * up(x)) without biases, its activation read from the config key ``act``."""
    kind, approximate = gated_activation(c, act)
    return mlp_section(kind, d_ff=c.intermediate_size, bias=False, approximate=approximate)


def corrected_sigmoid_moe(c: Any, n_experts: int) -> Any:
    """DeepSeek-V3's MoE as a family's config gives it: gated experts of ``hidden_act`` without biases
    (``intermediate_size`` for the dense layers, ``moe_intermediate_size`` for the experts), sigmoid scores
    ranked with a correction bias, within groups where ``n_group``/``topk_group`` set them, the top-k
    renormalised as ``norm_topk_prob`` says, times ``routed_scaling_factor``."""
    expert, approximate = gated_activation(c)
    return mlp_section(
        "moe",
        expert=expert,
        approximate=approximate,
        bias=False,
        d_ff=c.intermediate_size,
        expert_d_ff=c.moe_intermediate_size,
        routing=dict(
            n_experts=n_experts,
            top_k=c.num_experts_per_tok,
            scoring="sigmoid",
            normalize_top_k=bool(c.norm_topk_prob),
            correction_bias=True,
            n_groups=c.n_group or 1,
            top_groups=c.topk_group or 1,
            routed_scale=float(c.routed_scaling_factor),
        ),
    )


def plain_activation(cfg: ModelConfig) -> str:
    return PLAIN_TO_HF[activation(cfg.mlp)]
