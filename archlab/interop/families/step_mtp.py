"""Step-3.5's multi-token prediction layers (``num_nextn_predict_layers``, ``model.layers.<n_layer + k>``
of its checkpoints, DeepSeek-V3's names: ``families/mtp.py``) as transformers' ``MtpModel`` builds them from
a ``Step3p7TextConfig``: module k's block is a Step layer of type ``mtp_layer_types[k]`` (its RoPE that
type's) and MLP ``mtp_mlp_layer_types[k]``, clamped at ``swiglu_limits[k]`` / ``swiglu_limits_shared[k]``
(the model's layer k's entries: the config keeps none of the MTP layers' own), with the heads of
``mtp_per_layer_config`` where given, else those of its type (the published checkpoints' sliding MTP
layers have the sliding heads; transformers would build ``num_attention_heads``, so archlab writes them).
archlab's modules share one layer kind (``model.head.mtp.layer``): MTP layers that differ are refused."""

from __future__ import annotations

from typing import Any, NamedTuple

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs, used_kinds
from archlab.interop.families.base import Family, Problem, fmt
from archlab.interop.families.experts import is_dense
from archlab.interop.families.layered_moe import SECTIONS
from archlab.interop.families.values import differences, has_field, kind_field, leaf_fields, refuse_hf, value_of
from archlab.interop.families.windows import FULL, SLIDING
from archlab.nn.mlp import d_ff
from archlab.nn.moe import shared_config
from archlab.nn.mtp import mtp_layer

_ALIASED = " (transformers' MTP layer k clamps as the model's layer k)"


class StepLayer(NamedTuple):
    """What sets a Step layer apart: its attention type, MLP type ('dense' or 'sparse'), the routed
    experts' and the shared expert's (or dense MLP's) clamps (None: none) and its head count."""

    type: str
    mlp: str
    routed: float | None
    shared: float | None
    heads: int


def swiglu_bound(values: Any, i: int) -> float | None:
    """Layer ``i``'s SwiGLU bound in Step's per-layer list (absent, null or 0: no clamp)."""
    value = values[i] if values else None
    return float(value) if value else None


def clamps(lc: ModelConfig) -> tuple[float, float]:
    """A layer's entries of ``swiglu_limits`` and ``swiglu_limits_shared`` (0: no clamp; a dense layer's
    clamp is its shared entry)."""
    own = getattr(lc.mlp, "swiglu_limit", None) or 0.0  # an MLP of another kind than SwiGLU: refused apart
    if is_dense(lc):
        return 0.0, own
    return own, getattr(shared_config(lc).mlp, "swiglu_limit", None) or 0.0


def read_mtp(c: Any, depth: int, types: list[str], heads: dict[str, int]) -> StepLayer:
    """The layer of every one of ``c``'s ``depth`` MTP modules (``heads``: each layer type's head count),
    refusing a field that gives them different layers or one archlab cannot read."""
    attn, mlp = list(getattr(c, "mtp_layer_types", None) or []), list(getattr(c, "mtp_mlp_layer_types", None) or [])
    if len(attn) != depth or set(attn) - set(types):
        refuse_hf(c, "mtp_layer_types", f"{depth} entries, each a type of layer_types (its RoPE is its type's)", attn)
    if len(mlp) != depth or set(mlp) - {"dense", "sparse"}:
        refuse_hf(c, "mtp_mlp_layer_types", f"{depth} entries, each 'dense' or 'sparse'", mlp)
    if depth > c.num_hidden_layers:
        refuse_hf(c, "num_nextn_predict_layers", f"at most num_hidden_layers={c.num_hidden_layers}{_ALIASED}")
    own = {int(k): v for k, v in (getattr(c, "mtp_per_layer_config", None) or {}).items()}
    if {f for fields in own.values() for f in fields} - {"num_attention_heads"}:
        refuse_hf(c, "mtp_per_layer_config", "per-layer num_attention_heads alone", own)
    layers = [
        StepLayer(
            attn[k],
            mlp[k],
            None if mlp[k] == "dense" else swiglu_bound(c.swiglu_limits, k),
            swiglu_bound(c.swiglu_limits_shared, k),
            own.get(k, {}).get("num_attention_heads", heads[attn[k]]),
        )
        for k in range(depth)
    ]
    fields = ("mtp_layer_types", "mtp_mlp_layer_types", "swiglu_limits", "swiglu_limits_shared", "mtp_per_layer_config")
    for i, field in enumerate(fields):
        values = [layer[i] for layer in layers]
        if len(set(values)) > 1:
            refuse_hf(c, field, "one value for every MTP layer (archlab's modules share one layer kind)", values)
    return layers[0]


def mtp_to_hf(cfg: ModelConfig, full_heads: int) -> dict[str, Any]:
    """The config keys of ``cfg``'s modules: their count and layer types, and their heads wherever
    transformers' reading (``num_attention_heads``) or archlab's (its type's) could differ from them."""
    depth = cfg.head.mtp.depth
    if not depth:
        return {}
    lc = mtp_layer(cfg)
    sliding, n_head = lc.attention.window is not None, lc.attention.n_head
    out: dict[str, Any] = dict(
        num_nextn_predict_layers=depth,
        mtp_layer_types=[SLIDING if sliding else FULL] * depth,
        mtp_mlp_layer_types=["dense" if is_dense(lc) else "sparse"] * depth,
    )
    if sliding or n_head != full_heads:
        out["mtp_per_layer_config"] = {k: {"num_attention_heads": n_head} for k in range(depth)}
    return out


def mtp_problems(family: Family, varies: frozenset[str], cfg: ModelConfig) -> list[Problem]:
    """What ``family`` (Step-3.5, whose layers differ in ``varies`` alone) cannot hold of the modules' layer:
    a kind no layer has is held to the layers' rules; its type must be one of the layers' (with their window
    and RoPE), its dense width theirs, its clamps those transformers gives it (layer k's), its depth at most
    the layers'."""
    depth, kind = cfg.head.mtp.depth, cfg.head.mtp.layer
    if not depth:
        return []
    layers, lc = layer_configs(cfg), mtp_layer(cfg)

    def named(field: str) -> str:
        return kind_field(cfg, kind, field)

    found = []
    if depth > cfg.n_layer:
        found.append(Problem("model.head.mtp.depth", depth, f"at most model.n_layer={cfg.n_layer}", _ALIASED))
    if kind is not None and kind not in used_kinds(cfg):  # the modules' own kind: held to the layers' rules
        found += [p._replace(field=named(p.field)) for p in Family.part_problems(family, lc)]
        ref = next((layer for layer in layers if is_dense(layer) == is_dense(lc)), layers[0])
        for section in SECTIONS:
            for name in leaf_fields(getattr(cfg, section), f"model.{section}"):
                if name in varies or not (has_field(lc, name) and has_field(ref, name)):
                    continue
                if (value := value_of(lc, name)) != (wanted := value_of(ref, name)):
                    found.append(Problem(named(name), value, fmt(wanted), f" ({family.title} holds one value)"))
    sliding = lc.attention.window is not None
    same = [layer for layer in layers if (layer.attention.window is not None) == sliding]
    if not same:
        why = " (transformers' MTP layers take the RoPE of a type the model's layers have)"
        found.append(Problem(named("model.attention.window"), lc.attention.window, "a window of the layers'", why))
    else:
        why = f" ({family.title} holds one value per layer type)"
        if lc.attention.window != same[0].attention.window:
            found.append(Problem(named("model.attention.window"), lc.attention.window, fmt(same[0].attention.window)))
        for name, value, wanted in differences(lc.position, same[0].position):
            found.append(Problem(named(f"model.position.{name}"), value, fmt(wanted), why))
    dense = [layer for layer in layers if is_dense(layer)]
    if is_dense(lc) and dense and d_ff(lc) != d_ff(dense[0]):
        found.append(Problem(named("model.mlp.d_ff"), d_ff(lc), str(d_ff(dense[0])), " (one intermediate_size)"))
    routed, shared = clamps(lc)
    for k in range(min(depth, cfg.n_layer)):
        want_routed, want_shared = clamps(layers[k])
        if not is_dense(lc) and routed != want_routed:
            found.append(Problem(named("model.mlp.swiglu_limit"), routed, fmt(want_routed), _ALIASED))
        if shared != want_shared:
            field = "model.mlp.swiglu_limit" if is_dense(lc) else "model.mlp.shared_swiglu_limit"
            found.append(Problem(named(field), shared, fmt(want_shared), _ALIASED))
    return found
