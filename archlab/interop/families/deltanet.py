"""Gated DeltaNet and gated attention layers both ways, which Qwen3-Next, Qwen3.5 and Lara-Mini share: the
``linear_*`` config keys of the Gated DeltaNet layers, and the tensors of each: gated attention's ``q_proj``
with its output gate's rows per head, Gated DeltaNet's input projections grouped per key head (Qwen3-Next's)
or projected apart (Qwen3.5's, Lara-Mini's); and the layer kinds Qwen3-Next's and Qwen3.5's ``layer_types`` read
into."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.config.model import LayersConfig, shortest_layout
from archlab.interop.families.base import Problem
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import kind_field
from archlab.nn.mixers.base import head_dim
from archlab.nn.mixers.gated_deltanet import key_heads

LINEAR, FULL = "linear_attention", "full_attention"  # transformers' layer_types
DELTANET, ATTENTION, DENSE = "deltanet", "attention", "_dense"  # archlab's layer kinds (names)


def cfg_types(c: Any) -> list[str]:
    """A transformers config's ``layer_types`` as a list."""
    return list(c.layer_types)


def is_deltanet(lc: ModelConfig) -> bool:
    return lc.attention.kind == "gated_deltanet"


def linear_keys(lcs: list[ModelConfig]) -> dict[str, int]:
    """The ``linear_*`` config keys of the Gated DeltaNet layers among layer configs ``lcs`` (Qwen3-Next's
    and its descendants' names); none without such a layer (the class defaults, which no layer reads)."""
    linear = next((lc for lc in lcs if is_deltanet(lc)), None)
    if linear is None:
        return {}
    a = linear.attention
    return {
        "linear_num_value_heads": a.n_head,
        "linear_num_key_heads": key_heads(linear),
        "linear_key_head_dim": a.key_head_dim,
        "linear_value_head_dim": a.v_head_dim,
        "linear_conv_kernel_dim": a.conv_kernel,
    }


def deltanet_layers(c: Any, cfg: ModelConfig, dense: list[bool]) -> None:
    """``cfg.layers`` from ``layer_types``: a deltanet or attention kind per layer, ``_dense`` added where
    ``dense`` says the layer's MLP is the model's dense SwiGLU rather than its MoE."""
    names = [(DELTANET if t == LINEAR else ATTENTION) + (DENSE if d else "") for t, d in zip(cfg_types(c), dense)]
    if set(names) == {ATTENTION}:
        return
    linear = dict(
        kind="gated_deltanet",
        n_head=c.linear_num_value_heads,
        key_heads=c.linear_num_key_heads,
        key_head_dim=c.linear_key_head_dim,
        v_head_dim=c.linear_value_head_dim,
        conv_kernel=c.linear_conv_kernel_dim,
    )
    kinds: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(names):
        kinds[name] = {"attention": dict(linear)} if name.startswith(DELTANET) else {}
        if name.endswith(DENSE):
            kinds[name]["mlp"] = {"kind": "swiglu"}
    first, pattern = shortest_layout(names)
    cfg.layers = LayersConfig(kinds=kinds, first=first, pattern=pattern)


def gated_attention_tensors(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """q_proj (query and gate rows per head), k_proj, v_proj as archlab's qkv and gate; QK-norms, o_proj."""
    a, sizes = lc.attention, (lc.attention.n_head, head_dim(lc))
    for kind in ("weight", "bias") if a.qkv_bias else ("weight",):
        qkv = tuple(f"{hf}.{x}_proj.{kind}" for x in "qkv")
        gate = f"{archlab}.gate.{kind}"
        t.maps.append(TensorMap(f"{archlab}.qkv.{kind}", qkv, "gated_queries", sizes, others=(gate,)))
        t.maps.append(TensorMap(gate, qkv[:1], "gated_queries_gate", sizes))
    t.add(f"{archlab}.q_norm", f"{hf}.q_norm")
    t.add(f"{archlab}.k_norm", f"{hf}.k_norm")
    t.add(f"{archlab}.proj", f"{hf}.o_proj", a.out_bias)


def deltanet_tensors_grouped(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """in_proj_qkvz and in_proj_ba as archlab's one in_proj; conv1d, A_log, dt_bias, the gated norm, out_proj."""
    a = lc.attention
    sizes = (key_heads(lc), a.key_head_dim, a.n_head, a.v_head_dim)
    parts = (f"{hf}.in_proj_qkvz.weight", f"{hf}.in_proj_ba.weight")
    t.maps.append(TensorMap(f"{archlab}.in_proj.weight", parts, "deltanet_grouped", sizes))
    _deltanet_rest(t, archlab, hf)


def deltanet_tensors_apart(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """in_proj_qkv, in_proj_z, in_proj_b, in_proj_a stacked as archlab's in_proj; the rest as Qwen3-Next's."""
    a = lc.attention
    qkv = 2 * key_heads(lc) * a.key_head_dim + a.n_head * a.v_head_dim
    names = [f"{hf}.in_proj_{x}" for x in ("qkv", "z", "b", "a")]
    t.stacked(f"{archlab}.in_proj", names, False, (qkv, a.n_head * a.v_head_dim, a.n_head, a.n_head))
    _deltanet_rest(t, archlab, hf)


def _deltanet_rest(t: Tensors, archlab: str, hf: str) -> None:
    """conv1d, A_log, dt_bias, the gated norm and out_proj, after the input projections."""
    t.maps.append(TensorMap(f"{archlab}.conv_weight", (f"{hf}.conv1d.weight",), "depthwise_conv"))
    t.maps.append(TensorMap(f"{archlab}.A_log", (f"{hf}.A_log",)))
    t.maps.append(TensorMap(f"{archlab}.dt_bias", (f"{hf}.dt_bias",)))
    t.maps.append(TensorMap(f"{archlab}.norm_weight", (f"{hf}.norm.weight",)))
    t.add(f"{archlab}.proj", f"{hf}.out_proj")


def linear_layer_problems(
    cfg: ModelConfig, kind: str | None, lc: ModelConfig, gates: tuple[str, ...] = ("silu",)
) -> list[Problem]:
    """What a Gated DeltaNet layer (of layer kind ``kind``) sets that Qwen3-Next's and Lara-Mini's linear layers
    cannot hold: β in (0, 2), an output norm eps of its own, an output gate not among ``gates`` (their gated
    norm is norm(o)·silu(z) at rms_norm_eps; Qwen4-Exp's gates by silu or sigmoid)."""
    a, field = lc.attention, kind_field(cfg, kind, "model.attention")
    found = []
    if a.allow_neg_eigval:
        found.append(Problem(f"{field}.allow_neg_eigval", True, "false", " (its β is sigmoid(b), in (0, 1))"))
    if a.norm_eps not in (None, cfg.norm.eps):
        why = " (its linear layers' norm is at rms_norm_eps)"
        found.append(Problem(f"{field}.norm_eps", a.norm_eps, f"null or model.norm.eps={cfg.norm.eps}", why))
    if a.output_gate not in gates:
        why = f" (its linear layers gate by {' or '.join(gates)})"
        found.append(Problem(f"{field}.output_gate", a.output_gate, " or ".join(gates), why))
    return found
