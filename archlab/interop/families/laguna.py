"""Laguna (poolside, ``LagunaForCausalLM``): Step-3.5's layout less its (1 + w) norms and clamps, its output gate
a softplus (``model.attention.gate_activation: softplus``) per head or per value dim; full and sliding layers
each with their own RoPE, any layer its own head count, dense SwiGLU layers beside sigmoid-routed MoE ones."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.interop.families.base import Family, Problem, Rule, ungrouped
from archlab.interop.families.experts import is_dense, pre_norm_tensors, stack_saved_experts
from archlab.interop.families.layered import rope_of, view
from archlab.interop.families.layered_moe import _LayeredSparse, apply_layout, one_dense_width, one_window
from archlab.interop.families.mlps import GATED_TO_HF, activation, gated_activation, mlp_section
from archlab.interop.families.rope import rope_fraction, rope_to_hf
from archlab.interop.families.step import _ROPE_FIELDS, _rope_fields
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import has_field, kind_field, refuse_hf, value_of
from archlab.interop.families.windows import FULL, SLIDING, checked_types, sliding_to_hf
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width
from archlab.nn.rope import RoPEConfig

GATING = {"head": "per-head", "elementwise": "per-element"}  # archlab's gate -> Laguna's gating
RENAMES = (  # its checkpoints' names, as transformers' conversion mapping renames them on loading
    ("mlp.experts.e_score_correction_bias", "mlp.gate.e_score_correction_bias"),
    ("mlp.shared_expert.", "mlp.shared_experts."),
)


def _attention_tensors(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """A layer's q/k/v (of its own head count), o_proj, gate g_proj and per-head q/k norms."""
    layer = Tensors(lc)
    layer.qkv(f"{archlab}.qkv", hf, False)
    t.maps += layer.maps
    for name, hf_name in (("proj", "o_proj"), ("gate", "g_proj"), ("q_norm", "q_norm"), ("k_norm", "k_norm")):
        t.add(f"{archlab}.{name}", f"{hf}.{hf_name}")


class Laguna(_LayeredSparse):
    """LagunaForCausalLM: pre-norm RMSNorm blocks, q/k/v/o without biases, an RMSNorm on each head of q and
    k before RoPE, a softplus gate (``g_proj``, computed in float32) on the heads before ``o_proj``, per head
    or per value dim (``gating``); full or sliding-window attention per layer (``layer_types``), each layer
    with its own head count (``num_attention_heads_per_layer``) and each layer type with its own RoPE
    (``rope_parameters`` by type: base, partial rotation). Dense SwiGLU layers (``mlp_layer_types`` dense,
    width ``intermediate_size``) and MoE ones: top-k of sigmoid scores plus ``e_score_correction_bias``
    (selection only), renormalised, times ``moe_routed_scaling_factor``, beside one shared SwiGLU of
    ``shared_expert_intermediate_size``. Kinds: ``full`` or ``sliding``, then ``_dense`` and ``_h<heads>``
    where a layer differs from the first full layer's heads."""

    parts = "softplus-gated attention, per-head QK-norm, full/sliding layers with their own RoPE and heads, sigmoid MoE"

    model_type, title, model_class, config_class = "laguna", "Laguna", "LagunaForCausalLM", "LagunaConfig"
    features = frozenset(
        {
            "model.position.scaling.kind",
            "model.attention.qk_norm",
            "model.attention.window",
            "model.attention.gate",
            "model.attention.gate_activation",
            "model.layers.first",
            "model.layers.pattern",
        }
    )
    varies = frozenset(
        {
            "model.attention.window",
            "model.attention.n_head",
            "model.mlp.kind",
            *(f"model.position.{f}" for f in _ROPE_FIELDS),
        }
    )

    @staticmethod
    def full_rotary(cfg: ModelConfig) -> list[Problem]:
        return []  # Laguna rotates part of a head (partial_rotary_factor per layer type)

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        no_bias = " (its g_proj has no bias, and archlab's gate takes one with qkv_bias)"
        rules: list[Rule] = [
            ("model.attention.qk_norm", ("head",), " (it norms each head of q and k)"),
            ("model.attention.gate", ("head", "elementwise"), " (its g_proj gates each head or value dim)"),
            ("model.attention.gate_activation", ("softplus",), " (its gate is a softplus)"),
            ("model.attention.qkv_bias", (False,), no_bias),
            ("model.mlp.bias", (False,), " (its MLPs have no biases)"),
        ]
        if cfg.mlp.kind != "moe":
            return [*rules, ("model.mlp.kind", ("swiglu", "moe"), " (its dense layers are gated)")]
        return [
            *rules,
            ("model.mlp.expert", ("swiglu", "geglu"), " (its experts are gated)"),
            ("model.mlp.routing.scoring", ("sigmoid",), ""),
            ("model.mlp.routing.correction_bias", (True,), " (its router always has e_score_correction_bias)"),
            ("model.mlp.routing.normalize_top_k", (True,), " (it divides the chosen scores by their sum)"),
            ungrouped(" (it routes without groups)"),
            *(
                [("model.mlp.n_shared_experts", ("at least 1",), " (its MoE layers have a shared expert)")]
                if cfg.mlp.n_shared_experts < 1
                else []
            ),
        ]

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        """One window; per layer type, one RoPE; one width of the dense layers."""
        found = one_window(layers)
        for sliding in (False, True):
            at = [i for i, lc in enumerate(layers) if (lc.attention.window is not None) == sliding]
            for field in (f"model.position.{f}" for f in _ROPE_FIELDS):
                held = [i for i in at if has_field(layers[i], field)]  # a layer without RoPE: refused as such
                values = [value_of(layers[i], field) for i in held]
                i = next((i for i, v in zip(held, values) if v != values[0]), None)
                if i is not None:
                    why = f" (Laguna holds one value for all its {'sliding' if sliding else 'full'} layers)"
                    field_of = kind_field(cfg, layer_kind(cfg, i), field)
                    found.append(Problem(field_of, values[held.index(i)], repr(values[0]), why))
        found += one_dense_width(cfg, layers)
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        layers = layer_configs(cfg)
        types = [FULL if lc.attention.window is None else SLIDING for lc in layers]
        dense = [is_dense(lc) for lc in layers]
        by_type = {t: lc for t, lc in zip(types, layers)}
        moe = next((lc for lc, d in zip(layers, dense) if not d), cfg)
        base = self.base_to_hf(moe)  # a MoE layer's routing, the first full layer's head count
        del base["num_local_experts"]  # Laguna names the count num_experts
        return dict(
            base,
            num_attention_heads=by_type.get(FULL, layers[0]).attention.n_head,
            hidden_act=GATED_TO_HF[activation(cfg.mlp)],
            intermediate_size=d_ff(layers[dense.index(True)]) if any(dense) else d_ff(cfg),
            moe_intermediate_size=expert_width(moe),
            shared_expert_intermediate_size=max(moe.mlp.n_shared_experts, 1) * expert_width(moe),
            num_experts=moe.mlp.routing.n_experts,
            num_experts_per_tok=moe.mlp.routing.top_k,
            moe_routed_scaling_factor=moe.mlp.routing.routed_scale,
            mlp_layer_types=["dense" if d else "sparse" for d in dense],
            num_attention_heads_per_layer=[lc.attention.n_head for lc in layers],
            gating=GATING[cfg.attention.gate],
            rope_parameters={t: rope_to_hf(lc, rope_fraction(lc)) for t, lc in by_type.items()},
            **sliding_to_hf(cfg, layers),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.attention_bias:
            refuse_hf(c, "attention_bias", "false (archlab's gate takes a bias with q/k/v; Laguna's g_proj has none)")
        if c.moe_router_logit_softcapping:
            refuse_hf(c, "moe_router_logit_softcapping", "0.0 (archlab's router does not soft-cap its logits)")
        gating = "head" if c.gating is True or c.gating == "per-head" else "elementwise"
        if c.gating not in (True, "per-head", "per-element"):
            refuse_hf(c, "gating", "true, 'per-head' or 'per-element'", c.gating)
        n, types = c.num_hidden_layers, checked_types(c)
        mlp_types = list(c.mlp_layer_types)
        if "sparse" not in mlp_types:
            refuse_hf(c, "mlp_layer_types", "some 'sparse' layer (archlab's dense layers are kinds of a MoE model)")
        heads = list(c.num_attention_heads_per_layer)
        shared_width, width = c.shared_expert_intermediate_size, c.moe_intermediate_size
        if not shared_width or shared_width % width:
            refuse_hf(
                c, "shared_expert_intermediate_size", f"a multiple of moe_intermediate_size={width} (shared experts)"
            )
        hd, params = c.head_dim, c.rope_parameters or {}
        for t in sorted(set(types)):
            if not isinstance(params.get(t), dict):
                refuse_hf(c, f"rope_parameters.{t}", f"the RoPE parameters of the {t} layers", params.get(t))
        ropes = {t: rope_of(c, params[t], hd, t, partial=True) for t in set(types)}
        base_heads = heads[types.index(FULL)] if FULL in types else heads[0]
        expert, approximate = gated_activation(c)
        mlp = mlp_section(
            "moe",
            expert=expert,
            approximate=approximate,
            bias=False,
            d_ff=c.intermediate_size,
            expert_d_ff=width,
            n_shared_experts=shared_width // width,
            routing=dict(
                n_experts=c.num_experts,
                top_k=c.num_experts_per_tok,
                scoring="sigmoid",
                normalize_top_k=True,
                correction_bias=True,
                routed_scale=float(c.moe_routed_scaling_factor),
                aux_loss_weight=float(c.router_aux_loss_coef),
            ),
        )
        position = RoPEConfig(theta=ropes[types[0]].theta, pairing="half")
        cfg = self.base_from_hf(view(c, num_attention_heads=base_heads), position, mlp)
        cfg.attention.qk_norm, cfg.attention.gate, cfg.attention.gate_activation = "head", gating, "softplus"
        names, overrides = [], {}
        for i in range(n):
            sliding, dense = types[i] == SLIDING, mlp_types[i] == "dense"
            over: dict[str, dict[str, Any]] = {"position": _rope_fields(ropes[types[i]])}
            attention: dict[str, Any] = {"window": c.sliding_window} if sliding else {}
            name = "sliding" if sliding else "full"
            if dense:
                name += "_dense"
                over["mlp"] = {"kind": expert}
            if heads[i] != base_heads:
                name += f"_h{heads[i]}"
                attention["n_head"] = heads[i]
            if attention:
                over["attention"] = attention
            names.append(name)
            overrides[name] = over
        return apply_layout(cfg, names, overrides)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return pre_norm_tensors(cfg, _attention_tensors)

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The checkpoint's names as transformers renames them on loading, each expert stacked."""
        for old, new in RENAMES:
            state = {k.replace(old, new): v for k, v in state.items()}
        return stack_saved_experts(cfg, state)


RECORDS: tuple[Family, ...] = (Laguna(),)
