"""The Hugging Face mixture-of-experts families whose layers differ, one record each: gpt-oss, Llama 4
(text) and AFMoE (Arcee Trinity).

Each maps transformers' per-layer description (gpt-oss's and AFMoE's ``layer_types``; Llama 4's
``no_rope_layers``, ``layer_types`` and ``moe_layers``) to a ``model.layers`` layout of named kinds and back: ``from_hf``
names each layer's kind by what sets it apart, and writes the shortest ``first`` + cycled ``pattern`` that
gives every layer its kind (one kind for every layer folds into the model's own parts); ``to_hf`` reads
each layer's config (``archlab.config.layers.layer_configs``), so any layout that gives the same layers
exports, whichever kinds express it. What a family holds once for
the whole model (the heads, RoPE's base, the routing ...) must be the same on every layer: a layer kind
that changes it is refused, naming the kind's field (``model.layers.kinds.<kind>.attention.n_head``).

They are ``base.Family`` records like the others (``LAYERED_SPARSE``; ``families.FAMILIES`` joins
the tables; ``family_of`` finds them by what they hold, no routing table names them). gpt-oss and Llama 4
store their routed experts as [E, in, out] against archlab's [E, out, in] (layouts ``experts_transposed``
and, for gpt-oss's interleaved gate/up columns, ``gate_up_interleaved`` in ``base``); AFMoE as
archlab does, and its checkpoints each expert apart (``moe.stack_saved_experts``). Nothing here
imports transformers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from archlab.config import (
    BlockConfig,
    LayersConfig,
    MLPConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
    n_kv_head,
)
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import shortest_layout
from archlab.interop.families.base import (
    GATED_TO_HF,
    NO_HEAD_BIAS,
    Family,
    Problem,
    Rule,
    TensorMap,
    Tensors,
    config_head_dim,
    fmt,
    gated_activation,
    kind_field,
    out_bias,
    refuse_hf,
    ungrouped,
)
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.moe import (
    dense_first,
    dense_tensors,
    is_dense,
    mlp_tensors,
    pre_norm_tensors,
    stack_saved_experts,
)
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.windows import checked_types, sliding_to_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import chunk_of, head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width

SECTIONS = ("attention", "position", "mlp")  # the parts a layer kind may override


# ---------------------------------------------------------------- layouts both ways


def apply_layout(cfg: ModelConfig, names: list[str], overrides: dict[str, dict[str, dict[str, Any]]]) -> ModelConfig:
    """``cfg`` with layer i given the kind ``names[i]``, each kind overriding the fields ``overrides[kind]``
    names; one kind for every layer is merged into the model's own parts (no ``model.layers``)."""
    used = sorted(set(names), key=names.index)
    if len(used) == 1:
        for section, fields in overrides[used[0]].items():
            for key, value in fields.items():
                setattr(getattr(cfg, section), key, value)
        return cfg
    first, pattern = shortest_layout(names)
    cfg.layers = LayersConfig(kinds={k: overrides[k] for k in used}, first=first, pattern=pattern)
    return cfg


def one_window(layers: list[ModelConfig]) -> list[Problem]:
    """The one ``sliding_window`` transformers holds for all the sliding layers: two windows are refused."""
    windows = {w for lc in layers if (w := lc.attention.window) is not None}
    if len(windows) > 1:
        return [Problem("model.attention.window", sorted(windows), "one window for every sliding layer")]
    return []


def distinct_layers(cfg: ModelConfig) -> list[tuple[str | None, ModelConfig]]:
    """(kind, config) of each distinct layer config, in layer order (kind None: the model's own parts)."""
    seen: dict[str | None, ModelConfig] = {}
    for i, lc in enumerate(layer_configs(cfg)):
        seen.setdefault(layer_kind(cfg, i), lc)
    return list(seen.items())


def _unique(problems: list[Problem]) -> list[Problem]:
    out, seen = [], set()
    for p in problems:
        if (p.field, repr(p.value)) not in seen:
            seen.add((p.field, repr(p.value)))
            out.append(p)
    return out


class _LayeredSparse(Family):
    """What gpt-oss, Llama 4 and AFMoE share: LLaMA's names and an RMSNorm block (pre-norm but AFMoE's
    sandwich, ``block_kind``), no head bias, separate
    q/k/v, a router Linear and stacked routed experts; layers that differ in the fields ``varies``
    names, every other field of attention, position and MLP the same on every layer."""

    prefix = "model."
    keys = {**LLAMA_KEYS, "rms_norm_eps": "norm.eps"}
    varies: frozenset[str] = frozenset()  # model.<section>.<field> that may differ between layers

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", (self.block_kind,), ""),
            NO_HEAD_BIAS,
            out_bias(cfg.attention.qkv_bias, " (one attention_bias flag sets q/k/v and o)"),
            ("model.position.pairing", (self.pairing,), ""),
            *self.family_rules(cfg),
        ]

    pairing = "half"
    block_kind = "pre"

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        return []

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        """What the family requires of the layers together (which may differ, and how)."""
        return []

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems`` of every distinct layer config (a kind's refused field named as the kind's),
        then every field outside ``varies`` that differs between layers (named as the field of each kind
        that changes it), then ``layout_problems``."""
        kinds = distinct_layers(cfg)
        found: list[Problem] = []
        for kind, lc in kinds:
            found += [p._replace(field=kind_field(cfg, kind, p.field)) for p in super().part_problems(lc)]
            found += [p._replace(field=kind_field(cfg, kind, p.field)) for p in self.full_rotary(lc)]
        for section in SECTIONS:
            for f in dataclasses.fields(getattr(cfg, section)):
                name = f"model.{section}.{f.name}"
                if name in self.varies:
                    continue
                values = [(kind, getattr(getattr(lc, section), f.name)) for kind, lc in kinds]
                if len({repr(v) for _, v in values}) < 2:
                    continue
                # the value of the layers no kind changes it on, else layer 0's; each kind that differs named
                plain = [v for k, v in values if kind_field(cfg, k, name) == name]
                wanted = plain[0] if plain else values[0][1]
                why = f" ({self.title} holds one value for every layer)"
                found += [Problem(kind_field(cfg, k, name), v, fmt(wanted), why) for k, v in values if v != wanted]
        return _unique(found + self.layout_problems(cfg, layer_configs(cfg)))

    def base_to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        a = cfg.attention
        return dict(
            self.keys_to_hf(cfg),
            num_key_value_heads=n_kv_head(cfg),
            head_dim=head_dim(cfg),
            attention_dropout=a.dropout,
            attention_bias=a.qkv_bias,
            num_experts_per_tok=cfg.mlp.top_k,
            num_local_experts=cfg.mlp.n_experts,
            router_aux_loss_coef=cfg.mlp.aux_loss_weight,
        )

    def base_from_hf(self, c: Any, position: PositionConfig, mlp: MLPConfig) -> ModelConfig:
        hd = config_head_dim(c)
        bias = bool(c.attention_bias)
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="pre"),
            position=position,
            attention=AttentionConfig(
                n_kv_head=c.num_key_value_heads or c.num_attention_heads,
                head_dim=hd,
                qkv_bias=bias,
                out_bias=bias,
                dropout=float(c.attention_dropout),
            ),
            mlp=mlp,
        )
        return self.keys_from_hf(c, cfg)


# ---- gpt-oss


class GptOss(_LayeredSparse):
    """GptOssForCausalLM: q/k/v and o with biases (``attention_bias``), a learned sink logit per head,
    sliding-window or full attention per layer (``layer_types``, one ``sliding_window``), and a MoE in
    every layer: a router with a bias, softmax over the top-k logits, experts with biases and the clamped
    SwiGLU (up + 1)·g·σ(α·g) with the gate bounded by ``swiglu_limit`` and up clamped to it. RoPE halves,
    unscaled or transformers' generic YaRN: cos and sin times the attention factor, the softmax scale
    untouched (archlab's yarn without ``mscale``s), the band's ends rounded outward or not (``truncate``: false
    in the published configs and GptOssConfig's default)."""

    parts = "sinks, local/global layers, biased attention, a clamped SwiGLU MoE with router bias, YaRN"

    model_type, title, model_class, config_class = "gpt_oss", "gpt-oss", "GptOssForCausalLM", "GptOssConfig"
    features = frozenset(
        {
            "model.position.scaling",
            "model.position.truncate",
            "model.attention.window",
            "model.attention.sinks",
            "model.mlp.swiglu_limit",
            "model.mlp.swiglu_alpha",
            "model.mlp.up_offset",
            "model.mlp.router_bias",
            "model.layers.first",
            "model.layers.pattern",
        }
    )
    scalings = ("none", "yarn")
    varies = frozenset({"model.attention.window"})

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.attention.sinks", (True,), " (every head has a sink logit)"),
            ("model.mlp.kind", ("moe",), " (every layer is a MoE)"),
            ("model.mlp.expert", ("swiglu",), " (its experts are clamped SwiGLUs)"),
            ("model.mlp.bias", (True,), " (its experts have biases)"),
            ("model.mlp.router_bias", (True,), " (its router has a bias)"),
            ("model.mlp.scoring", ("softmax",), ""),
            ("model.mlp.normalize_top_k", (True,), " (a softmax over the top-k logits)"),
            ("model.mlp.correction_bias", (False,), ""),
            ungrouped(""),
            ("model.mlp.routed_scale", (1.0,), ""),
            ("model.mlp.n_shared_experts", (0,), " (it has no shared experts)"),
            ("model.mlp.weight_input", (False,), ""),
            ("model.mlp.swiglu_clamp", ("gate",), " (it bounds the gate before the activation)"),
            ("model.mlp.up_offset", (1.0,), " (its SwiGLU adds 1 to up)"),
            *self.limit_rules(cfg),
            # transformers' generic yarn scales cos/sin alone; archlab's mscale_all_dim also scales the softmax
            ("model.position.mscale", (None,), " (its YaRN never scales the softmax, as mscale_all_dim does)"),
            ("model.position.mscale_all_dim", (None,), " (its YaRN never scales the softmax)"),
        ]

    @staticmethod
    def limit_rules(cfg: ModelConfig) -> list[Rule]:
        if cfg.mlp.swiglu_limit is None:
            return [("model.mlp.swiglu_limit", ("a number",), " (its SwiGLU always clamps)")]
        return []

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        return one_window(layers)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        layers, m = layer_configs(cfg), cfg.mlp
        return dict(
            self.base_to_hf(cfg),
            intermediate_size=expert_width(cfg),
            hidden_act="silu",  # unread: the experts compute their own clamped SwiGLU
            swiglu_limit=m.swiglu_limit,
            swiglu_alpha=m.swiglu_alpha,
            rope_parameters=rope_to_hf(cfg),
            **sliding_to_hf(cfg, layers),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        hd = config_head_dim(c)
        rope = dict(c.rope_parameters or {})
        for key in ("mscale", "mscale_all_dim"):
            if rope.get(key):
                refuse_hf(
                    c,
                    f"rope_parameters.{key}",
                    "absent (transformers' gpt-oss YaRN scales cos and sin alone; archlab's mscales also scale the "
                    "softmax, DeepSeek's reading)",
                    rope[key],
                )
        position = rope_from_hf(c, hd, partial=False, scalings=("default", "yarn"))
        mlp = MLPConfig(
            kind="moe",
            expert="swiglu",
            bias=True,
            n_experts=c.num_local_experts,
            top_k=c.num_experts_per_tok,
            expert_d_ff=c.intermediate_size,
            normalize_top_k=True,
            router_bias=True,
            swiglu_limit=float(c.swiglu_limit),
            swiglu_alpha=float(c.swiglu_alpha),
            up_offset=1.0,
            aux_loss_weight=float(c.router_aux_loss_coef),
        )
        cfg = self.base_from_hf(c, position, mlp)
        cfg.attention.sinks = True
        types = checked_types(c)
        names = ["sliding" if t == "sliding_attention" else "full" for t in types]
        overrides = {"sliding": {"attention": {"window": c.sliding_window}}, "full": {}}
        return apply_layout(cfg, names, overrides)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm")
            t.add(f"{b}.mlp_norm", f"{h}.post_attention_layernorm")
            t.maps.append(TensorMap(f"{b}.attn.sinks", (f"{h}.self_attn.sinks",)))
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", cfg.attention.qkv_bias)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj", cfg.attention.out_bias)
            t.add(f"{b}.mlp.router", f"{h}.mlp.router", True)
            x, e = f"{b}.mlp.experts", f"{h}.mlp.experts"
            t.maps += [
                TensorMap(f"{x}.gate_up", (f"{e}.gate_up_proj",), "gate_up_interleaved"),
                TensorMap(f"{x}.gate_up_bias", (f"{e}.gate_up_proj_bias",), "gate_up_interleaved"),
                TensorMap(f"{x}.down", (f"{e}.down_proj",), "experts_transposed"),
                TensorMap(f"{x}.down_bias", (f"{e}.down_proj_bias",)),
            ]
        t.add("final_norm", "model.norm")
        return t.head()


# ---- Llama 4 (text)

_WIDTHS = frozenset(f"model.mlp.{f}" for f in ("d_ff", "multiplier", "ffn_dim_multiplier", "multiple_of"))


class Llama4(_LayeredSparse):
    """Llama4ForCausalLM (Llama4TextConfig): no biases but ``attention_bias``, RoPE on interleaved pairs
    (its complex rotation) on the layers ``no_rope_layers`` marks 1 and none on the others, chunked
    attention on the ``chunked_attention`` layers of ``layer_types``, the weightless L2 QK-norm (eps
    ``rms_norm_eps``, after RoPE) on the RoPE layers when ``use_qk_norm``, the queries of the NoPE layers
    times 1 + ``attn_scale``·log(1 + ⌊(p + 1) / ``floor_scale``⌋) when ``attn_temperature_tuning``; MoE
    on the ``moe_layers`` (top-k of the sigmoid of the logits, the score on the expert's input, one shared
    expert of the routed width ``intermediate_size``), a dense MLP of ``intermediate_size_mlp`` on the
    others. A layer's kind is named by its parts: ``rope`` (chunked where RoPE layers are), ``nope``,
    with ``_full`` (a RoPE layer not chunked), ``_chunked`` (a NoPE layer chunked), ``_dense``."""

    parts = "chunked RoPE layers and global NoPE layers (iRoPE), L2 QK-norm, query scaling, MoE"

    model_type, title, model_class, config_class = "llama4_text", "Llama 4", "Llama4ForCausalLM", "Llama4TextConfig"
    features = frozenset(
        {
            "model.position.scaling",
            "model.attention.chunk",
            "model.attention.qk_norm",
            "model.attention.query_scale_beta",
            "model.mlp.weight_input",
            "model.layers.first",
            "model.layers.pattern",
        }
    )
    position_why = " (or none on a layer, as no_rope_layers says)"
    pairing = "interleaved"
    varies = _WIDTHS | {
        "model.position.kind",
        "model.attention.chunk",
        "model.attention.qk_norm",
        "model.attention.query_scale_beta",
        "model.attention.query_scale_length",
        "model.attention.query_scale_offset",
        "model.mlp.kind",
    }

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        rules = [r for r in super().rules(cfg) if r[0] != "model.position.pairing" or cfg.position.kind == "rope"]
        return [
            *rules,
            ("model.attention.qk_norm", ("none", "l2"), " (its QK-norm is the weightless L2 one)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        # the base rule on model.position.kind wants rope: a NoPE layer (none) is held too
        return [p for p in super().part_problems(cfg) if not (p.field.endswith("position.kind") and p.value == "none")]

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        if cfg.mlp.kind != "moe":  # a dense layer: the experts' kind, no biases
            return [
                ("model.mlp.kind", (cfg.mlp.expert,), " (its dense layers are of its experts' kind)"),
                ("model.mlp.bias", (False,), ""),
            ]
        return [
            ("model.mlp.expert", ("swiglu", "geglu"), " (its experts are gated)"),
            ("model.mlp.bias", (False,), " (its experts have no biases)"),
            ("model.mlp.scoring", ("sigmoid",), ""),
            ("model.mlp.normalize_top_k", (False,), " (its weights are the sigmoid scores)"),
            ("model.mlp.weight_input", (True,), " (the score multiplies the expert's input)"),
            ("model.mlp.n_shared_experts", (1,), " (every MoE layer has one shared expert)"),
            ("model.mlp.correction_bias", (False,), ""),
            ("model.mlp.router_bias", (False,), ""),
            ungrouped(""),
            ("model.mlp.routed_scale", (1.0,), ""),
        ]

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        found: list[Problem] = []

        def one(field: str, values: dict[int, Any], wants: str) -> None:
            distinct = sorted({repr(v) for v in values.values()})
            if len(distinct) > 1:
                i = next(i for i, v in values.items() if repr(v) != repr(values[min(values)]))
                found.append(Problem(kind_field(cfg, layer_kind(cfg, i), field), values[i], wants))

        rope = {i: lc for i, lc in enumerate(layers) if lc.position.kind == "rope"}
        nope = {i: lc for i, lc in enumerate(layers) if lc.position.kind != "rope"}
        one(
            "model.attention.chunk", {i: chunk_of(lc, i) for i, lc in enumerate(layers) if chunk_of(lc, i)}, "one chunk"
        )
        one(
            "model.attention.qk_norm",
            {i: lc.attention.qk_norm for i, lc in rope.items()},
            "one QK-norm on every RoPE layer",
        )
        for i, lc in nope.items():
            if lc.attention.qk_norm != "none":
                why = " (Llama 4 norms q and k on its RoPE layers only)"
                found.append(
                    Problem(
                        kind_field(cfg, layer_kind(cfg, i), "model.attention.qk_norm"),
                        lc.attention.qk_norm,
                        "none",
                        why,
                    )
                )
        for i, lc in rope.items():
            if lc.attention.query_scale_beta is not None:
                why = " (Llama 4 scales the queries of its NoPE layers only)"
                found.append(
                    Problem(
                        kind_field(cfg, layer_kind(cfg, i), "model.attention.query_scale_beta"),
                        lc.attention.query_scale_beta,
                        "null",
                        why,
                    )
                )
        scaled = {i: lc.attention for i, lc in nope.items()}
        one(
            "model.attention.query_scale_beta",
            {i: a.query_scale_beta for i, a in scaled.items()},
            "one attn_scale on every NoPE layer",
        )
        for i, a in scaled.items():
            if a.query_scale_beta is not None:
                one(
                    "model.attention.query_scale_length",
                    {i: a.query_scale_length for i, a in scaled.items()},
                    "one floor_scale",
                )
                if a.query_scale_offset != 1:
                    why = " (Llama 4 counts positions from 1)"
                    found.append(
                        Problem(
                            kind_field(cfg, layer_kind(cfg, i), "model.attention.query_scale_offset"),
                            a.query_scale_offset,
                            "1",
                            why,
                        )
                    )
        dense = {i: lc for i, lc in enumerate(layers) if is_dense(lc)}
        moe = {i: lc for i, lc in enumerate(layers) if not is_dense(lc)}
        if not moe:
            found.append(Problem("model.mlp.kind", cfg.mlp.kind, "moe on some layer", " (Llama 4 has MoE layers)"))
        one("model.mlp.d_ff", {i: d_ff(lc) for i, lc in dense.items()}, "one width of every dense layer")
        one("model.mlp.expert_d_ff", {i: expert_width(lc) for i, lc in moe.items()}, "one expert width")
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        layers = layer_configs(cfg)
        rope = [lc.position.kind == "rope" for lc in layers]
        chunks = [chunk_of(lc, i) for i, lc in enumerate(layers)]
        dense = [i for i, lc in enumerate(layers) if is_dense(lc)]
        moe = [i for i in range(cfg.n_layer) if i not in dense]
        nope = [lc.attention for lc, r in zip(layers, rope) if not r]
        scaled = next((a for a in nope if a.query_scale_beta is not None), None)
        rope_cfg = layers[rope.index(True)] if any(rope) else None
        m = layers[moe[0]] if moe else cfg
        return dict(
            self.base_to_hf(m),
            hidden_act=GATED_TO_HF[(m.mlp.expert, m.mlp.approximate)],
            intermediate_size=expert_width(m),
            intermediate_size_mlp=d_ff(layers[dense[0]]) if dense else d_ff(m),
            moe_layers=moe,
            interleave_moe_layer_step=1,
            no_rope_layers=[int(r) for r in rope],
            use_qk_norm=rope_cfg is not None and rope_cfg.attention.qk_norm == "l2",
            rope_parameters=rope_to_hf(rope_cfg)
            if rope_cfg is not None
            else {"rope_type": "default", "rope_theta": cfg.position.theta},
            attention_chunk_size=next((c for c in chunks if c is not None), None),
            layer_types=["full_attention" if c is None else "chunked_attention" for c in chunks],
            attn_temperature_tuning=scaled is not None,
            attn_scale=scaled.query_scale_beta if scaled is not None else 0.1,
            floor_scale=scaled.query_scale_length if scaled is not None else 8192,
            router_jitter_noise=0.0,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.router_jitter_noise:
            refuse_hf(c, "router_jitter_noise", "0.0 (archlab's router has no input jitter)")
        expert, approximate = gated_activation(c)
        n = c.num_hidden_layers
        hd = config_head_dim(c)
        use_rope = [bool(r) for r in list(c.no_rope_layers)[:n]]
        types = checked_types(c, "chunked_attention")
        moe_layers = set(c.moe_layers)
        if not moe_layers & set(range(n)):
            refuse_hf(c, "moe_layers", "at least one layer (archlab's dense layers are kinds of a MoE model)")
        position = rope_from_hf(c, hd, partial=False)
        position.pairing = "interleaved"
        mlp = MLPConfig(
            kind="moe",
            expert=expert,
            approximate=approximate,
            bias=False,
            d_ff=c.intermediate_size_mlp,
            n_experts=c.num_local_experts,
            top_k=c.num_experts_per_tok,
            expert_d_ff=c.intermediate_size,
            n_shared_experts=1,
            scoring="sigmoid",
            normalize_top_k=False,
            weight_input=True,
            aux_loss_weight=float(c.router_aux_loss_coef),
        )
        cfg = self.base_from_hf(c, position, mlp)
        names, overrides = [], {}
        for i in range(n):
            chunked = types[i] == "chunked_attention"
            attention: dict[str, Any] = {"chunk": c.attention_chunk_size} if chunked else {}
            over: dict[str, dict[str, Any]] = {}
            if use_rope[i]:
                name = "rope" if chunked else "rope_full"
                if c.use_qk_norm:
                    attention["qk_norm"] = "l2"
            else:
                name = "nope_chunked" if chunked else "nope"
                over["position"] = {"kind": "none"}
                if c.attn_temperature_tuning:
                    attention.update(
                        query_scale_beta=float(c.attn_scale),
                        query_scale_length=int(c.floor_scale),
                        query_scale_offset=1,
                    )
            if attention:
                over["attention"] = attention
            if i not in moe_layers:
                name += "_dense"
                over["mlp"] = {"kind": expert}
            names.append(name)
            overrides[name] = over
        return apply_layout(cfg, names, overrides)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        def attention(t: Tensors, lc: ModelConfig, x: str, a: str) -> None:
            t.qkv(f"{x}.qkv", a, cfg.attention.qkv_bias)
            t.add(f"{x}.proj", f"{a}.o_proj", cfg.attention.out_bias)

        def mlp(t: Tensors, lc: ModelConfig, x: str, ff: str) -> None:
            """A dense layer; else the router, the routed experts ([E, in, out]) and the shared expert."""
            if is_dense(lc):
                dense_tensors(t, lc, x, ff)
                return
            f, s = expert_width(lc), f"{ff}.shared_expert"
            t.add(f"{x}.router", f"{ff}.router")
            t.maps += [
                TensorMap(f"{x}.experts.gate_up", (f"{ff}.experts.gate_up_proj",), "experts_transposed"),
                TensorMap(f"{x}.experts.down", (f"{ff}.experts.down_proj",), "experts_transposed"),
            ]
            t.stacked(f"{x}.shared.gate_up", [f"{s}.gate_proj", f"{s}.up_proj"], False, (f, f))
            t.add(f"{x}.shared.down", f"{s}.down_proj")

        return pre_norm_tensors(cfg, attention, mlp, "feed_forward")


# ---- AFMoE (Arcee Trinity)


class Afmoe(_LayeredSparse):
    """AfmoeForCausalLM: a norm before and after each sublayer (``input_layernorm``,
    ``post_attention_layernorm``, ``pre_mlp_layernorm``, ``post_mlp_layernorm``: archlab's sandwich block),
    q/k/v and o without biases, a per-head RMSNorm on q and k (before RoPE), an output gate
    σ(``gate_proj``·x) per value dim on the heads before ``o_proj`` (archlab's ``gate: elementwise``,
    without a bias), sliding-window attention with RoPE on the ``sliding_attention`` layers and full
    attention without positions on the others; the embeddings times √``hidden_size`` when
    ``mup_enabled``. The first ``num_dense_layers`` layers hold a dense gated MLP of
    ``intermediate_size`` (kinds ``*_dense``, setting ``mlp.kind`` to the experts'), the others a MoE: sigmoid scores, the top-k of the scores plus ``expert_bias``
    (selection only: archlab's ``correction_bias``), the chosen scores over their sum + 1e-20, times
    ``route_scale``, beside ``num_shared_experts`` shared experts as one MLP of n·``moe_intermediate_size``.
    Kinds: ``sliding`` (window, RoPE), ``full`` (no positions), each with ``_dense`` on the dense layers."""

    parts = "sandwich block, gated attention, local/global layers, sigmoid MoE, dense first layers"

    model_type, title, model_class, config_class = "afmoe", "AFMoE", "AfmoeForCausalLM", "AfmoeConfig"
    features = frozenset(
        {
            "model.scale_embedding",
            "model.position.scaling",
            "model.attention.qk_norm",
            "model.attention.window",
            "model.attention.gate",
            "model.layers.first",
            "model.layers.pattern",
        }
    )
    position_why = " (or none on its full layers)"
    block_kind = "sandwich"
    varies = frozenset({"model.attention.window", "model.position.kind", "model.mlp.kind"})

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        # the base rule on model.position.kind wants rope: a full layer's none is held too, and
        # layout_problems (again: the base rule's problem of a kind hid its own) says which layer needs which
        found = [p for p in super().part_problems(cfg) if not (p.value == "none" and p.why == self.position_why)]
        return _unique(found + self.layout_problems(cfg, layer_configs(cfg)))

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        no_gate_bias = " (its gate_proj has no bias, and archlab's gate takes one with qkv_bias)"
        attention: list[Rule] = [
            ("model.attention.qk_norm", ("head",), " (it norms each head of q and k)"),
            ("model.attention.gate", ("elementwise",), " (its gate_proj gates every value dim)"),
            ("model.attention.qkv_bias", (False,), no_gate_bias),
        ]
        if is_dense(cfg):  # a dense layer: the experts' kind, no biases
            return [*attention, ("model.mlp.kind", (cfg.mlp.expert,), " (its dense layers are of its experts' kind)")]
        return [
            *attention,
            ("model.mlp.expert", ("swiglu", "geglu"), " (its experts are gated)"),
            ("model.mlp.bias", (False,), " (its MLPs have no biases)"),
            ("model.mlp.scoring", ("sigmoid",), ""),
            ("model.mlp.correction_bias", (True,), " (its MoE layers always have expert_bias)"),
            ("model.mlp.normalize_top_k", (True,), " (it always divides the chosen scores by their sum)"),
            ungrouped(" (it routes without groups)"),
            *self.shared_rules(cfg),
        ]

    @staticmethod
    def shared_rules(cfg: ModelConfig) -> list[Rule]:
        if cfg.mlp.n_shared_experts < 1:
            return [("model.mlp.n_shared_experts", ("at least 1",), " (its MoE layers always have shared experts)")]
        return []

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        found = one_window(layers)
        n_dense = dense_first(layers)
        for i, lc in enumerate(layers):
            if i >= n_dense and is_dense(lc):
                why = " (AFMoE's dense layers are its first ones: num_dense_layers)"
                found.append(Problem(kind_field(cfg, layer_kind(cfg, i), "model.mlp.kind"), lc.mlp.kind, "moe", why))
            sliding, kind = lc.attention.window is not None, lc.position.kind
            if kind in ("rope", "none") and (kind == "rope") != sliding:
                field = kind_field(cfg, layer_kind(cfg, i), "model.position.kind")
                wants, why = (
                    ("rope", "its sliding layers") if sliding else ("none", "its full layers have no positions")
                )
                found.append(Problem(field, kind, wants, f" (AFMoE rotates exactly {why})" if sliding else f" ({why})"))
        return _unique(found)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        layers, m = layer_configs(cfg), cfg.mlp
        rope_cfg = next((lc for lc in layers if lc.position.kind == "rope"), cfg)
        base = self.base_to_hf(cfg)
        for key in ("num_local_experts", "router_aux_loss_coef"):  # AFMoE names the count num_experts, has no aux
            del base[key]
        return dict(
            base,
            hidden_act=GATED_TO_HF[(m.expert, m.approximate)],
            intermediate_size=d_ff(cfg),
            moe_intermediate_size=expert_width(cfg),
            num_dense_layers=dense_first(layers),
            num_experts=m.n_experts,
            num_shared_experts=m.n_shared_experts,
            route_scale=m.routed_scale,
            mup_enabled=cfg.scale_embedding,
            rope_parameters=rope_to_hf(rope_cfg),
            **sliding_to_hf(cfg, layers),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.attention_bias:
            refuse_hf(
                c, "attention_bias", "false (archlab's output gate takes a bias with q/k/v; AFMoE's gate_proj has none)"
            )
        expert, approximate = gated_activation(c)
        if not c.num_shared_experts:
            refuse_hf(
                c, "num_shared_experts", "at least 1 (archlab's shared experts are one MLP of n·moe_intermediate_size)"
            )
        n = c.num_hidden_layers
        types = checked_types(c)
        hd = config_head_dim(c)
        mlp = MLPConfig(
            kind="moe",
            expert=expert,
            approximate=approximate,
            bias=False,
            d_ff=c.intermediate_size,
            n_experts=c.num_experts,
            top_k=c.num_experts_per_tok,
            expert_d_ff=c.moe_intermediate_size,
            n_shared_experts=c.num_shared_experts,
            scoring="sigmoid",
            normalize_top_k=True,
            correction_bias=True,
            routed_scale=float(c.route_scale),
        )
        cfg = self.base_from_hf(c, rope_from_hf(c, hd, partial=False), mlp)
        cfg.block = BlockConfig(kind="sandwich")
        cfg.scale_embedding = bool(c.mup_enabled)
        cfg.attention.qk_norm, cfg.attention.gate = "head", "elementwise"
        n_dense = min(c.num_dense_layers or 0, n)
        names = [
            ("sliding" if t == "sliding_attention" else "full") + "_dense" * (i < n_dense) for i, t in enumerate(types)
        ]
        overrides: dict[str, dict[str, dict[str, Any]]] = {
            "sliding": {"attention": {"window": c.sliding_window}},
            "full": {"position": {"kind": "none"}},
        }
        for name in list(overrides):
            overrides[f"{name}_dense"] = {**overrides[name], "mlp": {"kind": expert}}
        return apply_layout(cfg, names, overrides)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for i, lc in enumerate(layer_configs(cfg)):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            for archlab, hf in (
                ("attn_norm", "input_layernorm"),
                ("attn_out_norm", "post_attention_layernorm"),
                ("mlp_norm", "pre_mlp_layernorm"),
                ("mlp_out_norm", "post_mlp_layernorm"),
            ):
                t.add(f"{b}.{archlab}", f"{h}.{hf}")
            a = f"{h}.self_attn"
            t.qkv(f"{b}.attn.qkv", a, False)
            t.add(f"{b}.attn.proj", f"{a}.o_proj")
            t.add(f"{b}.attn.gate", f"{a}.gate_proj")
            t.add(f"{b}.attn.q_norm", f"{a}.q_norm")
            t.add(f"{b}.attn.k_norm", f"{a}.k_norm")
            mlp_tensors(t, lc, f"{b}.mlp", f"{h}.mlp", "router.gate", "expert_bias")
        t.add("final_norm", "model.norm")
        return t.head()

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """transformers saves each routed expert apart (its qwen2_moe conversion): stacked as it loads them."""
        return stack_saved_experts(cfg, state)


RECORDS: tuple[Family, ...] = (GptOss(), Llama4(), Afmoe())
