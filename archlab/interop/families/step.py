"""Step-3.5 (StepFun, ``model_type`` step3p5), one ``base.Family`` record like those of ``layered_moe``,
whose helpers it shares. transformers 5.24 reads a step3p5 config as ``Step3p7TextConfig`` and has no
causal-LM class for it: ``to_hf`` builds, and ``from_hf`` reads, ``step_lm.causal_lm_class``'s."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from archlab.config import LayersConfig, ModelConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import shortest_layout
from archlab.interop.families.base import Family, Problem, Rule, ungrouped
from archlab.interop.families.experts import is_dense, pre_norm_tensors
from archlab.interop.families.layered import rope_of, view
from archlab.interop.families.layered_moe import _LayeredSparse, _unique, apply_layout, one_window
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.mtp import MTP_FEATURES
from archlab.interop.families.rope import rope_fraction, rope_to_hf
from archlab.interop.families.step_lm import causal_lm_class
from archlab.interop.families.step_mtp import StepLayer, clamps, mtp_problems, mtp_to_hf, read_mtp, swiglu_bound
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import has_field, kind_field, refuse_hf, value_of
from archlab.interop.families.windows import FULL, SLIDING, checked_types, sliding_to_hf
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width, shared_config
from archlab.nn.mtp import mtp_layer, with_depth
from archlab.nn.rope import RoPEConfig

# what a Step-3.5 layer kind sets of the model's RoPE: every field that its two layer types may set apart
_SCALED = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_context")}
_ROPE_FIELDS = ("theta", "rotary_fraction", "rotary_dim", "scaling.kind", *(f"scaling.{f}" for f in _SCALED["llama3"]))
# Step-3.7's checkpoint names of the MoE (transformers' conversion_mapping "step3p7") -> the model's
_STEP37_NAMES = {
    ".moe.gate.weight": ".mlp.gate.weight",
    ".moe.router_bias": ".mlp.gate.e_score_correction_bias",
    ".moe.down_proj.weight": ".mlp.experts.down_proj",
    ".moe.gate_proj.weight": ".mlp.experts.gate_up_proj",
    ".share_expert.": ".mlp.shared_experts.",
}
_PAD_ID = 1  # Step3p7TextConfig's pad_token_id: an int (None is refused); archlab holds no special tokens


def _rope_fields(rope: RoPEConfig) -> dict[str, Any]:
    """What a layer kind sets of one layer type's RoPE: its base, its rotated part where not the whole head,
    and its scaling with every field of it."""
    default, scaled = RoPEConfig(), _SCALED.get(rope.scaling.kind, ())
    fields = {f: getattr(rope, f) for f in _ROPE_FIELDS[:3] if f == "theta" or getattr(rope, f) != getattr(default, f)}
    if scaled:
        fields["scaling"] = {f: getattr(rope.scaling, f) for f in ("kind", *scaled)}
    return fields


def _attention_tensors(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """A layer's q/k/v (of its own head count), o_proj, head gate g_proj and per-head q/k norms."""
    layer = Tensors(lc)
    layer.qkv(f"{archlab}.qkv", hf, False)
    t.maps += layer.maps
    for name, hf_name in (("proj", "o_proj"), ("gate", "g_proj"), ("q_norm", "q_norm"), ("k_norm", "k_norm")):
        t.add(f"{archlab}.{name}", f"{hf}.{hf_name}")


def _tag(limit: float) -> str:
    return f"{limit:g}".replace(".", "p")


def _kind(
    c: Any, layer: StepLayer, rope: RoPEConfig, base_heads: int, per_type: dict[str, int]
) -> tuple[str, dict[str, Any]]:
    """A layer's kind: its name (type, then ``_dense``, its clamps, and ``_heads<n>`` where its heads are
    not its type's) and its overrides of the model's parts (read with the full layers' heads)."""
    sliding, dense, routed, shared = layer.type == SLIDING, layer.mlp == "dense", layer.routed, layer.shared
    over: dict[str, dict[str, Any]] = {"position": _rope_fields(rope)}
    attention: dict[str, Any] = {"window": c.sliding_window} if sliding else {}
    if layer.heads != base_heads:
        attention["n_head"] = layer.heads
    if attention:
        over["attention"] = attention
    name, mlp_over = "sliding" if sliding else "full", {}
    if dense:
        name += "_dense"
        mlp_over["kind"] = "swiglu"
        if shared is not None:
            name += f"_clamp{_tag(shared)}"
            mlp_over.update(swiglu_limit=shared, swiglu_clamp="activation")
    else:
        if routed is not None:
            name += f"_clamp{_tag(routed)}"
            mlp_over.update(swiglu_limit=routed, swiglu_clamp="activation")
        if shared is not None:
            name += f"_shared{_tag(shared)}"
        if shared != routed:  # unset, the shared expert takes the routed limit; 0: none
            mlp_over.update(shared_swiglu_limit=0.0 if shared is None else shared, swiglu_clamp="activation")
    if mlp_over:
        over["mlp"] = mlp_over
    if layer.heads != per_type[layer.type]:
        name += f"_heads{layer.heads}"
    return name, over


class Step35(_LayeredSparse):
    """Step3p5ForCausalLM (``Step3p7TextModel`` and an LM head): pre-norm blocks of (1 + w) RMSNorms,
    q/k/v/o without biases, a (1 + w) RMSNorm on each head of q and k before RoPE, a sigmoid gate per head
    (``g_proj``) on the heads before ``o_proj``; full or sliding-window attention per layer (``layer_types``),
    the sliding layers with their own head count (``num_sliding_attention_heads``) and each layer type with
    its own RoPE (``rope_parameters`` by type: base, partial rotation, llama3 or linear scaling). Dense SwiGLU
    layers (``mlp_layer_types`` dense, width ``intermediate_size``) and MoE ones: top-k of sigmoid scores plus
    ``e_score_correction_bias`` (selection only), renormalised, times ``moe_router_scaling_factor``, beside
    one shared SwiGLU of ``share_expert_dim``. SwiGLUs clamp per layer as min(silu(g), L)·clamp(u, -L, L)
    (archlab's ``swiglu_clamp: activation``): the routed experts at ``swiglu_limits[i]``, the shared expert
    and a dense layer at ``swiglu_limits_shared[i]`` (0 or null: none). Kinds: ``full`` or ``sliding``, then
    ``_dense``, ``_clamp<L>`` (routed), ``_shared<L>`` (shared or dense)."""

    parts = "(1 + w) norms, gated attention, per-head QK-norm, full/sliding layers with their own heads, clamped MoE"

    model_type, title, model_class, config_class = "step3p5", "Step-3.5", "Step3p5ForCausalLM", "Step3p7TextConfig"
    features = (
        frozenset(
            {
                "model.norm.unit_offset",
                "model.position.scaling.kind",
                "model.attention.qk_norm",
                "model.attention.scale",
                "model.attention.window",
                "model.attention.gate",
                "model.mlp.swiglu_limit",
                "model.mlp.shared_swiglu_limit",
                "model.layers.first",
                "model.layers.pattern",
            }
        )
        | MTP_FEATURES
    )
    # its checkpoints' multi-token prediction layers, model.layers.<n_layer + k> (step_mtp)
    mtp_keys, mtp_stacked = ("num_nextn_predict_layers",), True
    varies = frozenset(
        {
            "model.attention.window",
            "model.attention.n_head",
            "model.mlp.kind",
            "model.mlp.swiglu_limit",
            "model.mlp.shared_swiglu_limit",
            "model.mlp.swiglu_clamp",
            *(f"model.position.{f}" for f in _ROPE_FIELDS),
        }
    )

    def hf_class(self, transformers: Any) -> type:
        return causal_lm_class()

    @staticmethod
    def full_rotary(cfg: ModelConfig) -> list[Problem]:
        return []  # Step rotates part of a head (partial_rotary_factor per layer type)

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        no_bias = " (its g_proj has no bias, and archlab's gate takes one with qkv_bias)"
        rules: list[Rule] = [
            ("model.norm.unit_offset", (True,), " (its RMSNorms scale by 1 + w)"),
            ("model.attention.qk_norm", ("head",), " (it norms each head of q and k)"),
            ("model.attention.gate", ("head",), " (its g_proj gates each head)"),
            ("model.attention.qkv_bias", (False,), no_bias),
            ("model.mlp.bias", (False,), " (its MLPs have no biases)"),
        ]
        m = cfg.mlp
        if m.kind != "moe":
            rules.append(("model.mlp.kind", ("swiglu", "moe"), " (its dense layers are SwiGLUs)"))
        else:
            rules += [
                ("model.mlp.expert", ("swiglu",), " (its experts are SwiGLUs)"),
                ("model.mlp.routing.scoring", ("sigmoid",), ""),
                ("model.mlp.routing.correction_bias", (True,), " (its router always has e_score_correction_bias)"),
                ("model.mlp.routing.normalize_top_k", (True,), " (it divides the chosen scores by their sum)"),
                ungrouped(" (it routes without groups)"),
            ]
            if m.n_shared_experts < 1:
                rules.append(("model.mlp.n_shared_experts", ("at least 1",), " (its MoE layers have a shared expert)"))
        limit = getattr(m, "swiglu_limit", None)  # only SwiGLU's (and a mixture of experts') clamp
        clamped = limit is not None or (m.kind == "moe" and shared_config(cfg).mlp.swiglu_limit is not None)
        if clamped:
            rules.append(("model.mlp.swiglu_clamp", ("activation",), " (it bounds silu(gate) after the activation)"))
        return rules

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return _unique(super().part_problems(cfg) + mtp_problems(self, self.varies, cfg))

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        """One window; per layer type, one head count and one RoPE; one width of the dense layers."""
        found = one_window(layers)
        for sliding in (False, True):
            at = [i for i, lc in enumerate(layers) if (lc.attention.window is not None) == sliding]
            for field in ("model.attention.n_head", *(f"model.position.{f}" for f in _ROPE_FIELDS)):
                held = [i for i in at if has_field(layers[i], field)]  # a layer without RoPE: refused as such
                values = [value_of(layers[i], field) for i in held]
                i = next((i for i, v in zip(held, values) if v != values[0]), None)
                if i is not None:
                    what = "sliding" if sliding else "full"
                    why = f" (Step-3.5 holds one value for all its {what} layers)"
                    found.append(
                        Problem(kind_field(cfg, layer_kind(cfg, i), field), values[held.index(i)], repr(values[0]), why)
                    )
        dense = [i for i, lc in enumerate(layers) if is_dense(lc) and lc.mlp.kind != "none"]  # none: its kind
        widths = [d_ff(layers[i]) for i in dense]
        i = next((i for i, w in zip(dense, widths) if w != widths[0]), None)
        if i is not None:
            found.append(
                Problem(kind_field(cfg, layer_kind(cfg, i), "model.mlp.d_ff"), widths[dense.index(i)], str(widths[0]))
            )
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        layers = layer_configs(cfg)
        types = [FULL if lc.attention.window is None else SLIDING for lc in layers]
        dense = [is_dense(lc) for i, lc in enumerate(layers)]
        by_type = {t: lc for t, lc in zip(types, layers)}
        full, sliding = by_type.get(FULL, layers[0]), by_type.get(SLIDING, layers[0])
        moe = next((lc for lc, d in zip(layers, dense) if not d), cfg)
        widths = [d_ff(lc) for lc in [*layers, mtp_layer(cfg)] if is_dense(lc)]  # a dense MTP layer's too
        base = self.base_to_hf(dataclasses.replace(full, mlp=moe.mlp))  # the router's keys: a MoE layer's
        for key in ("num_local_experts", "router_aux_loss_coef"):  # Step names the count n_routed_experts, has no aux
            del base[key]
        scale = cfg.attention.scale
        return dict(
            base,
            intermediate_size=widths[0] if widths else d_ff(cfg),
            moe_intermediate_size=expert_width(moe),
            share_expert_dim=max(moe.mlp.n_shared_experts, 1) * expert_width(moe),
            n_routed_experts=moe.mlp.routing.n_experts,
            num_experts_per_tok=moe.mlp.routing.top_k,
            moe_router_scaling_factor=moe.mlp.routing.routed_scale,
            mlp_layer_types=["dense" if d else "sparse" for d in dense],
            num_sliding_attention_heads=sliding.attention.n_head,
            query_pre_attn_scalar=head_dim(cfg) if scale is None else scale**-2,
            rope_parameters={t: rope_to_hf(lc, rope_fraction(lc)) for t, lc in by_type.items()},
            swiglu_limits=[clamps(lc)[0] for lc in layers],
            swiglu_limits_shared=[clamps(lc)[1] for lc in layers],
            pad_token_id=_PAD_ID,
            **sliding_to_hf(cfg, layers),
            **mtp_to_hf(cfg, full.attention.n_head),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        return self._read(c, 0)[0]

    def with_mtp(self, cfg: ModelConfig, c: Any, depth: int) -> ModelConfig:
        """``cfg`` read again with the modules' layer kind (``step_mtp.read_mtp``) beside the layers'."""
        read, kind = self._read(c, depth)
        return with_depth(read, depth, kind)

    def _read(self, c: Any, depth: int) -> tuple[ModelConfig, str | None]:
        """archlab's config of ``c`` with the kind of the layer of its ``depth`` MTP modules (none for 0;
        None: the model's own parts)."""
        for name, allowed in (
            ("attention_bias", "false (archlab's head gate takes a bias with q/k/v; Step's g_proj has none)"),
            ("mlp_bias", "false (Step's routed experts have no biases; archlab's take them with its other MLPs)"),
            ("use_bidirectional_attention", "false (archlab's attention is causal)"),
        ):
            if getattr(c, name, False):
                refuse_hf(c, name, allowed)
        gating = getattr(c, "gating", True)
        if not (gating is True or gating == "per-head"):
            refuse_hf(c, "gating", "true or 'per-head' (transformers' Step3p7Attention gates whole heads only)", gating)
        n = c.num_hidden_layers
        types = checked_types(c)
        mlp_types = list(c.mlp_layer_types or [])
        if len(mlp_types) != n or set(mlp_types) - {"dense", "sparse"}:
            refuse_hf(c, "mlp_layer_types", f"{n} entries, each 'dense' or 'sparse'", mlp_types)
        if "sparse" not in mlp_types:
            refuse_hf(c, "mlp_layer_types", "some 'sparse' layer (archlab's dense layers are kinds of a MoE model)")
        varying = set(getattr(c, "per_layer_attributes", None) or ()) - {"num_attention_heads"}
        if varying:
            refuse_hf(c, "per_layer_config", "per-layer num_attention_heads alone", sorted(varying))
        heads = [c.per_layer_config[i].num_attention_heads for i in range(n)] if c.is_heterogeneous else []
        heads = heads or [c.num_attention_heads] * n
        shared_width, width = c.share_expert_dim, c.moe_intermediate_size
        if not shared_width or shared_width % width:
            refuse_hf(c, "share_expert_dim", f"a multiple of moe_intermediate_size={width} (archlab's shared experts)")
        hd, params = c.head_dim, c.rope_parameters or {}
        for t in sorted(set(types)):
            if not isinstance(params.get(t), dict):
                refuse_hf(c, f"rope_parameters.{t}", f"the RoPE parameters of the {t} layers", params.get(t))
        ropes = {t: rope_of(c, params[t], hd, t, partial=True) for t in set(types)}
        base_heads = heads[types.index(FULL)] if FULL in types else heads[0]
        mlp = mlp_section(
            "moe",
            expert="swiglu",
            bias=False,
            d_ff=c.intermediate_size,
            expert_d_ff=width,
            n_shared_experts=shared_width // width,
            routing=dict(
                n_experts=c.num_local_experts,
                top_k=c.num_experts_per_tok,
                scoring="sigmoid",
                normalize_top_k=True,
                correction_bias=True,
                routed_scale=float(c.moe_router_scaling_factor),
            ),
        )
        position = RoPEConfig(theta=ropes[types[0]].theta, pairing="half")
        cfg = self.base_from_hf(view(c, num_attention_heads=base_heads), position, mlp)
        cfg.norm.unit_offset = True
        cfg.attention.qk_norm, cfg.attention.gate = "head", "head"
        if c.query_pre_attn_scalar != hd:
            cfg.attention.scale = float(c.query_pre_attn_scalar) ** -0.5
        per_type = {t: heads[types.index(t)] for t in set(types)}  # each type's head count (its first layer's)
        names, overrides = [], {}
        for i in range(n):
            layer = StepLayer(
                types[i],
                mlp_types[i],
                swiglu_bound(c.swiglu_limits, i),
                swiglu_bound(c.swiglu_limits_shared, i),
                heads[i],
            )
            name, overrides[name] = _kind(c, layer, ropes[types[i]], base_heads, per_type)
            names.append(name)
        if not depth:
            return apply_layout(cfg, names, overrides), None
        mtp, over = _kind(c, layer := read_mtp(c, depth, types, per_type), ropes[layer.type], base_heads, per_type)
        if mtp in names:  # the modules' layer is one of the model's kinds (its own parts, where it has one)
            return apply_layout(cfg, names, overrides), mtp if len(set(names)) > 1 else None
        first, pattern = shortest_layout(names)
        cfg.layers = LayersConfig(kinds={**{k: overrides[k] for k in names}, mtp: over}, first=first, pattern=pattern)
        return cfg, mtp

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return pre_norm_tensors(cfg, _attention_tensors)

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Without the multi-token-prediction layers a published checkpoint holds after the model's
        (``num_nextn_predict_layers``: not part of the causal LM); Step-3.7's names of the MoE (``moe.*``,
        ``share_expert``, gate and up stacked apart) as transformers reads them."""
        extra = tuple(f"model.layers.{i}." for i in range(cfg.n_layer, cfg.n_layer + 16))
        out = {}
        for name, tensor in state.items():
            if name.startswith(extra) or name.endswith(".moe.up_proj.weight"):
                continue
            old = next((o for o in _STEP37_NAMES if o in name), None)
            if old == ".moe.gate_proj.weight":  # stacked [E, d_ff, d] each: gate_up_proj's halves
                tensor = torch.cat([tensor, state[name.replace(".gate_proj.", ".up_proj.")]], dim=1)
            out[name if old is None else name.replace(old, _STEP37_NAMES[old])] = tensor
        return out


RECORDS: tuple[Family, ...] = (Step35(),)
