"""MiMo-V2-Flash (Xiaomi, ``MiMoV2FlashForCausalLM``): value heads narrower than its query/key heads
(``model.attention.v_head_dim``), sliding layers with twice the key/value heads and attention sinks beside
full ones, each layer type with its own partial RoPE, a dense first layer and DeepSeek-V3's sigmoid router
without shared experts. Its values' constant scale (``attention_value_scale``) is folded into ``v_proj`` as it
loads and written back as none."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from archlab.config import ModelConfig, n_kv_head
from archlab.config.layers import layer_configs, layer_kind
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule, out_bias
from archlab.interop.families.experts import is_dense, pre_norm_tensors, stack_saved_experts
from archlab.interop.families.layered import rope_of
from archlab.interop.families.layered_moe import _LayeredSparse, _unique, apply_layout, one_dense_width, one_window
from archlab.interop.families.mlps import GATED_TO_HF, activation, corrected_sigmoid_moe
from archlab.interop.families.rope import rope_fraction, rope_to_hf
from archlab.interop.families.step import _ROPE_FIELDS, _rope_fields
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import has_field, kind_field, refuse_hf, value_of
from archlab.interop.families.windows import FULL, SLIDING, checked_types, sliding_to_hf
from archlab.nn.mixers.attention import v_head_dim
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width
from archlab.nn.rope import RoPEConfig

SINKS = ("self_attn.attention_sink_bias", "self_attn.sinks")  # its checkpoints' name, transformers'


def _attention_tensors(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """A layer's q/k/v (of its own key/value heads, values of v_head_dim), o_proj and, sliding, its sinks."""
    layer = Tensors(lc)
    layer.qkv(f"{archlab}.qkv", hf, lc.attention.qkv_bias)
    t.maps += layer.maps
    t.add(f"{archlab}.proj", f"{hf}.o_proj")
    if lc.attention.sinks:  # a Parameter of its own, not a module's weight
        t.maps.append(TensorMap(f"{archlab}.sinks", (f"{hf}.sinks",)))


def _in_dims(rope: RoPEConfig, hd: int) -> RoPEConfig:
    """``rope`` with its rotated part as ``rotary_dim`` (0.334 of 192 dims and the 1/3 written back both
    rotate 64): one spelling, whichever fraction the config gave."""
    if rope.rotary_fraction is None:
        return rope
    return dataclasses.replace(rope, rotary_dim=round(rope.rotary_fraction * hd), rotary_fraction=None)


class MiMoV2Flash(_LayeredSparse):
    """MiMoV2FlashForCausalLM: pre-norm RMSNorm blocks, q/k/v with ``attention_bias`` and o_proj without,
    query/key heads of ``head_dim`` and value heads of ``v_head_dim``, values times ``attention_value_scale``
    (folded into v_proj); full attention, or sliding-window attention with twice ``num_key_value_heads`` and a
    sink per head (``layer_types``), each layer type with its own RoPE (``rope_parameters`` by type, partial).
    Dense SwiGLU layers (``mlp_layer_types`` dense, width ``intermediate_size``) and MoE ones: DeepSeek-V3's
    router (sigmoid scores plus ``e_score_correction_bias`` for the choice, ``n_group``/``topk_group``,
    ``norm_topk_prob``, times ``routed_scaling_factor``), no shared experts. Kinds: ``full`` or ``sliding``,
    each with ``_dense``."""

    parts = "narrower value heads, sliding layers with 2× KV heads and sinks, per-type partial RoPE, V3 router"

    model_type, title = "mimo_v2_flash", "MiMo-V2-Flash"
    model_class, config_class = "MiMoV2FlashForCausalLM", "MiMoV2FlashConfig"
    features = frozenset(
        {
            "model.position.scaling.kind",
            "model.attention.window",
            "model.attention.sinks",
            "model.attention.v_head_dim",
            "model.layers.first",
            "model.layers.pattern",
        }
    )
    varies = frozenset(
        {
            "model.attention.window",
            "model.attention.n_kv_head",
            "model.attention.sinks",
            "model.mlp.kind",
            *(f"model.position.{f}" for f in _ROPE_FIELDS),
        }
    )

    @staticmethod
    def full_rotary(cfg: ModelConfig) -> list[Problem]:
        return []  # MiMo rotates part of a head (partial_rotary_factor per layer type)

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        rules: list[Rule] = [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre",), ""),
            NO_HEAD_BIAS,
            out_bias(False, " (its o_proj has no bias)"),
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.bias", (False,), " (its MLPs have no biases)"),
        ]
        if cfg.mlp.kind != "moe":
            return [*rules, ("model.mlp.kind", ("swiglu", "geglu", "moe"), " (its dense layers are gated)")]
        return [
            *rules,
            ("model.mlp.expert", ("swiglu", "geglu"), " (its experts are gated)"),
            ("model.mlp.routing.scoring", ("sigmoid",), ""),
            ("model.mlp.routing.correction_bias", (True,), " (its router always has e_score_correction_bias)"),
            ("model.mlp.n_shared_experts", (0,), " (MiMo-V2-Flash's MoE has no shared experts)"),
        ]

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        """One window; sinks and twice the full layers' key/value heads on exactly the sliding layers; per
        layer type one RoPE; one width of the dense layers."""
        found = one_window(layers)
        full_kv = next((n_kv_head(lc) for lc in layers if lc.attention.window is None), None)
        for i, lc in enumerate(layers):
            kind, sliding = layer_kind(cfg, i), lc.attention.window is not None
            if lc.attention.sinks != sliding:
                why = f" ({self.title} has sinks on exactly its sliding layers)"
                field = kind_field(cfg, kind, "model.attention.sinks")
                found.append(Problem(field, lc.attention.sinks, str(sliding).lower(), why))
            if sliding and full_kv is not None and n_kv_head(lc) != 2 * full_kv:
                why = f" ({self.title}'s sliding layers have twice the full layers' key/value heads)"
                found.append(
                    Problem(kind_field(cfg, kind, "model.attention.n_kv_head"), n_kv_head(lc), str(2 * full_kv), why)
                )
        for sliding in (False, True):
            at = [i for i, lc in enumerate(layers) if (lc.attention.window is not None) == sliding]
            for field in (f"model.position.{f}" for f in _ROPE_FIELDS):
                held = [i for i in at if has_field(layers[i], field)]
                values = [value_of(layers[i], field) for i in held]
                i = next((i for i, v in zip(held, values) if v != values[0]), None)
                if i is not None:
                    why = f" ({self.title} holds one value for all its {'sliding' if sliding else 'full'} layers)"
                    found.append(
                        Problem(kind_field(cfg, layer_kind(cfg, i), field), values[held.index(i)], repr(values[0]), why)
                    )
        found += one_dense_width(cfg, layers)
        return _unique(found)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        layers = layer_configs(cfg)
        types = [FULL if lc.attention.window is None else SLIDING for lc in layers]
        dense = [is_dense(lc) for lc in layers]
        by_type = {t: lc for t, lc in zip(types, layers)}
        moe = next((lc for lc, d in zip(layers, dense) if not d), cfg)
        full = by_type.get(FULL)
        base = self.base_to_hf(moe)
        for key in ("num_local_experts", "router_aux_loss_coef"):  # MiMo names the count n_routed_experts, has no aux
            del base[key]
        r = moe.mlp.routing
        return dict(
            base,
            num_key_value_heads=n_kv_head(full) if full is not None else n_kv_head(layers[0]) // 2,
            head_dim=head_dim(cfg),
            v_head_dim=v_head_dim(cfg),
            attention_value_scale=None,  # folded into v_proj as a checkpoint loads
            hidden_act=GATED_TO_HF[activation(cfg.mlp)],
            intermediate_size=d_ff(layers[dense.index(True)]) if any(dense) else d_ff(cfg),
            moe_intermediate_size=expert_width(moe),
            n_routed_experts=r.n_experts,
            routed_scaling_factor=r.routed_scale,
            n_group=r.n_groups,
            topk_group=r.top_groups,
            norm_topk_prob=r.normalize_top_k,
            mlp_layer_types=["dense" if d else "sparse" for d in dense],
            rope_parameters={t: rope_to_hf(lc, rope_fraction(lc)) for t, lc in by_type.items()},
            **sliding_to_hf(cfg, layers),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        n, types = c.num_hidden_layers, checked_types(c)
        mlp_types = list(c.mlp_layer_types)
        if "sparse" not in mlp_types:
            refuse_hf(c, "mlp_layer_types", "some 'sparse' layer (archlab's dense layers are kinds of a MoE model)")
        hd, params = c.head_dim, c.rope_parameters or {}
        for t in sorted(set(types)):
            if not isinstance(params.get(t), dict):
                refuse_hf(c, f"rope_parameters.{t}", f"the RoPE parameters of the {t} layers", params.get(t))
        ropes = {t: _in_dims(rope_of(c, params[t], hd, t, partial=True), hd) for t in set(types)}
        mlp = corrected_sigmoid_moe(c, c.n_routed_experts)
        position = RoPEConfig(theta=ropes[types[0]].theta, pairing="half")
        cfg = self.base_from_hf(c, position, mlp)
        cfg.attention.out_bias = False
        cfg.attention.v_head_dim = c.v_head_dim if c.v_head_dim != hd else None
        names, overrides = [], {}
        for i in range(n):
            sliding, dense = types[i] == SLIDING, mlp_types[i] == "dense"
            over: dict[str, dict[str, Any]] = {"position": _rope_fields(ropes[types[i]])}
            if sliding:
                over["attention"] = {"window": c.sliding_window, "n_kv_head": 2 * c.num_key_value_heads, "sinks": True}
            name = ("sliding" if sliding else "full") + "_dense" * dense
            if dense:
                over["mlp"] = {"kind": mlp.expert}
            names.append(name)
            overrides[name] = over
        return apply_layout(cfg, names, overrides)

    def hf_weights(self, c: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """v_proj's weight (and bias) times ``attention_value_scale``: the values' scale folded in."""
        scale = c.attention_value_scale
        if scale is None or scale == 1.0:
            return state
        return {k: v * scale if ".self_attn.v_proj." in k else v for k, v in state.items()}

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return pre_norm_tensors(cfg, _attention_tensors)

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Without the multi-token-prediction layers (``model.mtp.*``, which transformers ignores), the sinks
        under transformers' name, each expert stacked."""
        old, new = SINKS
        state = {k.replace(old, new): v for k, v in state.items() if not k.startswith("model.mtp.")}
        return stack_saved_experts(cfg, state)


RECORDS: tuple[Family, ...] = (MiMoV2Flash(),)
