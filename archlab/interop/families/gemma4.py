"""Gemma 4's text decoder (``Gemma4ForCausalLM``, ``gemma4_text``): Gemma 3's sandwich layers of sliding and
full attention with plain RMSNorm scales (w, not 1 + w), an unscaled value RMSNorm (``attention.v_norm``) and
scores unscaled (``attention.scale: 1.0``); full layers with heads of their own size and count
(``per_layer_config``), proportional RoPE (``position.turning_fraction``) and, with ``attention_k_eq_v``, values
that are the keys' projection (``attention.v_from_k``); the last ``num_kv_shared_layers`` layers reading the
keys and values of the last earlier layer of their type (``attention.kv_shared``), their MLP twice as wide with
``use_double_wide_mlp``; per-layer input embeddings (``model.per_layer_input``) and a scalar per layer
(``block.layer_scalar``); with ``enable_moe_block`` experts beside each MLP (``mlp.kind: moe`` with ``beside``:
Gemma's router of the normed stream, ``routing.router_norm`` and ``expert_scale``). Kinds: ``local`` and
``global`` by layer type, each with ``_shared``; the model's own parts are layer 0's."""

from __future__ import annotations

import dataclasses
from typing import Any

from archlab.config import BlockConfig, HeadConfig, ModelConfig, NormConfig, n_kv_head
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig, PerLayerInputConfig, shortest_layout
from archlab.interop.families.base import (
    LAYERS,
    NO_HEAD_BIAS,
    ONE_BIAS_FLAG,
    Family,
    Problem,
    Rule,
    first_per_field,
    out_bias,
    section_problems,
)
from archlab.interop.families.lfm3 import rope_from_lfm3, rope_to_lfm3
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import differences, kind_field, refuse_hf
from archlab.interop.families.windows import FULL, SLIDING, checked_types, layer_types, sliding_window
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width
from archlab.nn.rope import RoPEConfig

# transformers' hidden_activation -> archlab's gated MLP, its GELU form and the per-layer inputs' activation
ACTIVATIONS = {
    "gelu_pytorch_tanh": ("geglu", "tanh", "gelu_tanh"),
    "gelu": ("geglu", "none", "gelu"),
    "silu": ("swiglu", "none", "silu"),
}
KIND = {SLIDING: "local", FULL: "global"}
# what Gemma 4's mixture of experts beside the MLP (enable_moe_block) is, of archlab's MoE's fields
MOE_WHY = " (Gemma 4's experts beside its MLP: enable_moe_block)"
MOE_RULES: list[Rule] = [
    ("model.mlp.beside", (True,), MOE_WHY),
    ("model.mlp.n_shared_experts", (0,), MOE_WHY),
    ("model.mlp.out_norm", (False,), MOE_WHY),
    ("model.mlp.routing.scoring", ("softmax",), MOE_WHY),
    ("model.mlp.routing.normalize_top_k", (True,), MOE_WHY),
    ("model.mlp.routing.router_norm", (True,), MOE_WHY),
    ("model.mlp.routing.expert_scale", (True,), MOE_WHY),
    ("model.mlp.routing.routed_scale", (1.0,), MOE_WHY),
    ("model.mlp.routing.n_groups", (1,), MOE_WHY),
    ("model.mlp.routing.correction_bias", (False,), MOE_WHY),
    ("model.mlp.routing.router_bias", (False,), MOE_WHY),
    ("model.mlp.routing.weight_input", (False,), MOE_WHY),
]


def _activation(cfg: ModelConfig) -> str | None:
    """transformers' hidden_activation of ``cfg``'s MLP (and per-layer inputs), or None where it has none."""
    m = cfg.mlp
    form = (m.expert if m.kind == "moe" else m.kind, getattr(m, "approximate", "none"))
    pli = cfg.per_layer_input.activation if cfg.per_layer_input.dim else None
    return next(
        (hf for hf, (kind, approx, act) in ACTIVATIONS.items() if (kind, approx) == form and pli in (None, act)),
        None,
    )


def _type_parts(c: Any, i: int, t: str) -> tuple[dict[str, Any], RoPEConfig]:
    """Layer ``i``'s (of type ``t``) attention fields and RoPE."""
    layer = c.per_layer_config[i]
    hd = layer.head_dim
    attention = dict(
        window=c.sliding_window if t == SLIDING else None,
        head_dim=hd,
        n_kv_head=layer.num_key_value_heads,
        v_from_k=bool(c.attention_k_eq_v) and t == FULL,
    )
    return attention, rope_from_lfm3(c, t, hd)


class Gemma4(Family):
    """Gemma4ForCausalLM: see the module docstring."""

    model_type, title, model_class, config_class = "gemma4_text", "Gemma 4", "Gemma4ForCausalLM", "Gemma4TextConfig"
    prefix = "model."
    parts = (
        "sandwich layers, v-norm, per-type heads, proportional RoPE, K=V, shared KV, per-layer inputs, MoE beside MLP"
    )
    features = LAYERS | {
        "model.scale_embedding",
        "model.attention.qk_norm",
        "model.attention.scale",
        "model.attention.window",
        "model.attention.v_norm",
        "model.attention.v_from_k",
        "model.attention.kv_shared",
        "model.head.softcap",
        "model.position.turning_fraction",
        "model.block.layer_scalar",
        "model.per_layer_input.dim",
        "model.mlp.beside",
        "model.mlp.routing.router_norm",
        "model.mlp.routing.expert_scale",
    }
    keys = {**LLAMA_KEYS, "rms_norm_eps": "norm.eps", "attention_dropout": "attention.dropout"}
    # use_bidirectional_attention values whose text-only model is causal ("vision" makes only image tokens see
    # each other, which a text-only class never has)
    causal_values: tuple[str | None, ...] = (None,)
    needs_inputs_to_share = True  # transformers 5.24 slices the per-layer inputs before the shared layers

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        a = cfg.attention
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("sandwich",), ""),
            ("model.mlp.kind", ("geglu", "swiglu", "moe"), " (a gated MLP, or experts beside one)"),
            ("model.block.layer_scalar", (True,), " (every layer has its layer_scalar)"),
            ("model.scale_embedding", (True,), " (embeddings are multiplied by sqrt(d_model))"),
            NO_HEAD_BIAS,
            ("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)"),
            ("model.attention.v_norm", (True,), " (its v_norm)"),
            ("model.attention.scale", (1.0,), " (its scores are unscaled)"),
            out_bias(a.qkv_bias, ONE_BIAS_FLAG),
            ("model.mlp.bias", (False,), ""),
            *(MOE_RULES if cfg.mlp.kind == "moe" else []),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems`` of the model's own parts, then each layer's against the first layer of its type
        (one attention, RoPE and MLP per type but for what kv_shared and the double-wide MLP change), values
        from the keys on the full layers alone or none, the shared layers last, one MLP width (twice it on
        the shared layers where any is wider), the last layer full, one activation for the MLP and the
        per-layer inputs."""
        found = super().part_problems(cfg)
        lcs = layer_configs(cfg)
        types = layer_types(lcs)
        first = {t: next(lc for lc, u in zip(lcs, types) if u == t and not lc.attention.kv_shared) for t in types}
        plain = next((lc for lc in lcs if not lc.attention.kv_shared), lcs[0])
        if not hasattr(plain.mlp, "d_ff"):  # an MLP kind without a width (none): the model's own problems name it
            return found
        base_width = d_ff(plain)
        widths = {d_ff(lc) for lc in lcs if lc.attention.kv_shared}
        wide = widths == {2 * base_width}
        k_eq_v = any(lc.attention.v_from_k for lc in lcs if lc.attention.window is None)
        shared_from = next((i for i, lc in enumerate(lcs) if lc.attention.kv_shared), len(lcs))
        layered: list[Problem] = []
        for i, (lc, t) in enumerate(zip(lcs, types)):
            kind, ref = layer_kind(cfg, i), first[t]
            shared = lc.attention.kv_shared
            v_from_k = lc.attention.v_from_k if shared else k_eq_v and t == FULL  # a shared layer's is unread
            same = dataclasses.replace(ref.attention, kv_shared=shared, v_from_k=v_from_k)
            why = "one attention and RoPE per layer type"
            wanted = [("attention", lc.attention, same, why), ("position", lc.position, ref.position, why)]
            width = 2 * base_width if shared and wide else base_width
            wanted.append(
                ("mlp", lc.mlp, dataclasses.replace(plain.mlp, d_ff=width), "one MLP, twice as wide where shared")
            )
            if lc.position.kind == "rope":
                whole = RoPEConfig(theta=lc.position.theta, turning_fraction=lc.position.turning_fraction)
                wanted.append(("position", lc.position, whole, "RoPE half-paired, unscaled, over whole heads"))
            layered.extend(section_problems(cfg, kind, wanted, self.title))
            if i > shared_from and not shared:
                field = kind_field(cfg, kind, "model.attention.kv_shared")
                layered.append(Problem(field, False, "true", f" ({self.title} shares the keys of its last layers)"))
        if shared_from < len(lcs) and not cfg.per_layer_input.dim and self.needs_inputs_to_share:
            why = " (transformers 5.24's Gemma4ForCausalLM fails on shared layers without them: Gemma 4 Unified's)"
            layered.append(Problem("model.per_layer_input.dim", 0, "a positive width with kv_shared layers", why))
        if types[-1] != FULL:  # transformers makes the last layer full whatever layer_types says
            field = kind_field(cfg, layer_kind(cfg, len(lcs) - 1), "model.attention.window")
            layered.append(Problem(field, lcs[-1].attention.window, "null", f" ({self.title}'s last layer is full)"))
        if _activation(cfg) is None:
            field = "model.per_layer_input.activation" if cfg.per_layer_input.dim else "model.mlp.kind"
            layered.append(Problem(field, cfg.mlp.kind, "geglu or swiglu, the per-layer inputs' activation its own"))
        return first_per_field(found + layered)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs = layer_configs(cfg)
        types = layer_types(lcs)
        by_type = {t: lc for lc, t in zip(lcs, types)}
        base = lcs[0]
        shared = sum(lc.attention.kv_shared for lc in lcs)
        plain = next((lc for lc in lcs if not lc.attention.kv_shared), base)
        pli = cfg.per_layer_input
        return dict(
            self.keys_to_hf(cfg),
            num_key_value_heads=n_kv_head(base),
            head_dim=head_dim(base),
            per_layer_config={
                i: {"head_dim": head_dim(lc), "num_key_value_heads": n_kv_head(lc)}
                for i, lc in enumerate(lcs)
                if (head_dim(lc), n_kv_head(lc)) != (head_dim(base), n_kv_head(base))
            },
            intermediate_size=d_ff(plain),
            hidden_activation=_activation(cfg),
            layer_types=types,
            sliding_window=sliding_window(cfg, lcs),
            rope_parameters={t: rope_to_lfm3(by_type.get(t, base).position) for t in (SLIDING, FULL)},
            attention_bias=cfg.attention.qkv_bias,
            attention_k_eq_v=any(lc.attention.v_from_k for lc in lcs),
            num_kv_shared_layers=shared,
            use_double_wide_mlp=any(d_ff(lc) != d_ff(plain) for lc in lcs),
            final_logit_softcapping=cfg.head.softcap,
            hidden_size_per_layer_input=pli.dim,
            vocab_size_per_layer_input=cfg.vocab_size if pli.vocab is None else pli.vocab,
            **_moe_to_hf(cfg),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if getattr(c, "use_bidirectional_attention", None) not in self.causal_values:
            allowed = " or ".join("null" if v is None else repr(v) for v in self.causal_values)
            refuse_hf(c, "use_bidirectional_attention", f"{allowed} (archlab's attention is causal)")
        hidden = c.hidden_activation
        if hidden not in ACTIVATIONS:
            refuse_hf(c, "hidden_activation", " or ".join(repr(a) for a in ACTIVATIONS), hidden)
        kind, approximate, act = ACTIVATIONS[hidden]
        types, n = checked_types(c), c.num_hidden_layers
        parts = [_type_parts(c, i, t) for i, t in enumerate(types)]
        base_attention, base_rope = parts[0]
        bias = bool(c.attention_bias)
        attention = AttentionConfig(
            **base_attention, qkv_bias=bias, out_bias=bias, qk_norm="head", v_norm=True, scale=1.0
        )
        ple = getattr(c, "hidden_size_per_layer_input", 0) or 0
        vocab = getattr(c, "vocab_size_per_layer_input", c.vocab_size)
        cfg = ModelConfig(
            dropout=0.0,
            scale_embedding=True,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="sandwich", layer_scalar=True),
            position=base_rope,
            attention=attention,
            mlp=_mlp_from_hf(c, kind, approximate),
            head=HeadConfig(bias=False, softcap=c.final_logit_softcapping),
            per_layer_input=PerLayerInputConfig(
                dim=ple, vocab=None if vocab == c.vocab_size or not ple else vocab, activation=act
            ),
        )
        cfg = self.keys_from_hf(c, cfg)
        cfg.attention.dropout = float(cfg.attention.dropout)
        first_shared = n - c.num_kv_shared_layers
        names, kinds = [], {}
        for i, (t, (fields, rope)) in enumerate(zip(types, parts)):
            shared = i >= first_shared
            name = KIND[t] + ("_shared" if shared else "")
            over: dict[str, Any] = {}
            attention_over = {k: v for k, v in fields.items() if v != base_attention[k]}
            if shared:  # no projections: its values are its server's, whatever they are
                attention_over = {k: v for k, v in attention_over.items() if k != "v_from_k"}
                attention_over["kv_shared"] = True
            if attention_over:
                over["attention"] = attention_over
            position = {f: v for f, v, _ in differences(rope, base_rope)}
            if position:
                over["position"] = position
            if shared and c.use_double_wide_mlp:
                over["mlp"] = {"d_ff": 2 * c.intermediate_size}
            names.append(name)
            kinds[name] = over
        if len(set(names)) > 1 or kinds[names[0]]:
            first, pattern = shortest_layout(names)
            cfg.layers = LayersConfig(kinds=kinds, first=first, pattern=pattern)
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for lc, b, h in t.layers(**GEMMA_NORMS):
            attention_tensors(t, lc, b, h)
            f = d_ff(lc)
            dense = f"{b}.mlp.dense" if lc.mlp.kind == "moe" else f"{b}.mlp"
            t.stacked(f"{dense}.gate_up", [f"{h}.mlp.gate_proj", f"{h}.mlp.up_proj"], False, (f, f))
            t.add(f"{dense}.down", f"{h}.mlp.down_proj")
            if lc.mlp.kind == "moe":
                _moe_tensors(t, b, h)
            if cfg.per_layer_input.dim:
                layer_input_tensors(t, b, h)
            t.maps.append(TensorMap(f"{b}.layer_scalar", (f"{h}.layer_scalar",)))
        if cfg.per_layer_input.dim:
            per_layer_input_tensors(t)
        t.add("final_norm", "model.norm")
        return t.head()


# Gemma 3n's and 4's four norms around a layer's two sublayers, by archlab's names
GEMMA_NORMS = dict(
    attn_norm="input_layernorm",
    attn_out_norm="post_attention_layernorm",
    mlp_norm="pre_feedforward_layernorm",
    mlp_out_norm="post_feedforward_layernorm",
)


def attention_tensors(t: Tensors, lc: ModelConfig, b: str, h: str) -> None:
    """A Gemma 3n / 4 layer's attention: q, and k and v unless it reads an earlier layer's (``kv_shared``) or
    its values are its keys (``v_from_k``), stacked as archlab's qkv; the q and k norms; o_proj."""
    a, hd, kv = lc.attention, head_dim(lc), n_kv_head(lc)
    names, sizes = [f"{h}.self_attn.q_proj"], [a.n_head * hd]
    if not a.kv_shared:
        names.append(f"{h}.self_attn.k_proj")
        sizes.append(kv * hd)
        if not a.v_from_k:
            names.append(f"{h}.self_attn.v_proj")
            sizes.append(kv * hd)
        t.add(f"{b}.attn.k_norm", f"{h}.self_attn.k_norm")
    t.stacked(f"{b}.attn.qkv", names, a.qkv_bias, tuple(sizes))
    t.add(f"{b}.attn.q_norm", f"{h}.self_attn.q_norm")
    t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj", a.out_bias)


def layer_input_tensors(t: Tensors, b: str, h: str) -> None:
    """A layer's gate, projection and norm of its per-layer input."""
    t.add(f"{b}.per_layer_input.gate", f"{h}.per_layer_input_gate")
    t.add(f"{b}.per_layer_input.up", f"{h}.per_layer_projection")
    t.add(f"{b}.per_layer_input.norm", f"{h}.post_per_layer_input_norm")


def per_layer_input_tensors(t: Tensors) -> None:
    """The model's per-layer input table, its projection of the embeddings and that projection's norm."""
    t.add("per_layer_inputs.table", "model.embed_tokens_per_layer")
    t.add("per_layer_inputs.projection", "model.per_layer_model_projection")
    t.add("per_layer_inputs.norm", "model.per_layer_projection_norm")


def _mlp_from_hf(c: Any, kind: str, approximate: str) -> Any:
    """archlab's MLP of every layer: the gated MLP, or with ``enable_moe_block`` a MoE of experts of that kind
    beside it (softmax router over the normed stream, top-k renormalised, a scale per expert)."""
    if not getattr(c, "enable_moe_block", False):
        return mlp_section(kind, approximate, d_ff=c.intermediate_size, bias=False)
    routing = dict(
        n_experts=c.num_experts,
        top_k=c.top_k_experts,
        scoring="softmax",
        normalize_top_k=True,
        router_norm=True,
        expert_scale=True,
    )
    return mlp_section(
        "moe",
        approximate,
        expert=kind,
        d_ff=c.intermediate_size,
        expert_d_ff=c.moe_intermediate_size,
        bias=False,
        beside=True,
        routing=routing,
    )


def _moe_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """transformers' keys of the experts beside the MLP (``enable_moe_block`` false without them)."""
    m = cfg.mlp
    if m.kind != "moe":
        return {"enable_moe_block": False}
    return dict(
        enable_moe_block=True,
        num_experts=m.routing.n_experts,
        top_k_experts=m.routing.top_k,
        moe_intermediate_size=expert_width(cfg),
    )


def _moe_tensors(t: Tensors, b: str, h: str) -> None:
    """The router (its projection, the scale after its norm, the experts' scales), the stacked experts and the
    three norms of the experts beside the MLP."""
    t.add(f"{b}.mlp.router", f"{h}.router.proj")
    t.maps.append(TensorMap(f"{b}.mlp.router_scale", (f"{h}.router.scale",)))
    t.maps.append(TensorMap(f"{b}.mlp.expert_scale", (f"{h}.router.per_expert_scale",)))
    t.maps.append(TensorMap(f"{b}.mlp.experts.gate_up", (f"{h}.experts.gate_up_proj",)))
    t.maps.append(TensorMap(f"{b}.mlp.experts.down", (f"{h}.experts.down_proj",)))
    t.add(f"{b}.mlp.dense_norm", f"{h}.post_feedforward_layernorm_1")
    t.add(f"{b}.mlp.experts_norm", f"{h}.pre_feedforward_layernorm_2")
    t.add(f"{b}.mlp.experts_out_norm", f"{h}.post_feedforward_layernorm_2")


class Gemma4Unified(Gemma4):
    """Gemma4UnifiedForCausalLM (``gemma4_unified_text``): Gemma 4's text decoder without per-layer inputs or a
    mixture of experts, its ``use_bidirectional_attention`` 'vision' by default (causal on text alone). Its
    layouts are Gemma 4's too, which they export to (it defers), but for those with shared keys and values,
    which transformers' Gemma 4 fails to run without per-layer inputs."""

    model_type, title = "gemma4_unified_text", "Gemma 4 Unified"
    model_class, config_class = "Gemma4UnifiedForCausalLM", "Gemma4UnifiedTextConfig"
    parts = "Gemma 4's layers without per-layer inputs"
    features = Gemma4.features - {"model.per_layer_input.dim"}
    causal_values = (None, "vision")
    needs_inputs_to_share = False
    defers = True

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [*super().rules(cfg), ("model.mlp.kind", ("geglu", "swiglu"), " (Gemma 4 Unified has no experts)")]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        out = super().to_hf(cfg)
        for key in ("hidden_size_per_layer_input", "vocab_size_per_layer_input", "enable_moe_block"):
            del out[key]
        return dict(out, use_bidirectional_attention=None)


RECORDS: tuple[Family, ...] = (Gemma4(), Gemma4Unified())
