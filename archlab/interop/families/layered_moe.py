"""What the Hugging Face mixture-of-experts families whose layers differ share (gpt-oss in ``gpt_oss``,
Llama 4 in ``llama4``, AFMoE in ``afmoe``, and ``step``, ``mellum``, ``cohere2_moe``, ``global_nope_moe``).

Each maps transformers' per-layer description (gpt-oss's and AFMoE's ``layer_types``; Llama 4's
``no_rope_layers``, ``layer_types`` and ``moe_layers``) to a ``model.layers`` layout of named kinds and back: ``from_hf``
names each layer's kind by what sets it apart, and writes the shortest ``first`` + cycled ``pattern`` that
gives every layer its kind (one kind for every layer folds into the model's own parts); ``to_hf`` reads
each layer's config (``archlab.config.layers.layer_configs``), so any layout that gives the same layers
exports, whichever kinds express it. What a family holds once for
the whole model (the heads, RoPE's base, the routing ...) must be the same on every layer: a layer kind
that changes it is refused, naming the kind's field (``model.layers.kinds.<kind>.attention.n_head``).

Their records are ``base.Family`` records like the others (``family_of`` finds them by what they hold, no routing table names them). gpt-oss and Llama 4
store their routed experts as [E, in, out] against archlab's [E, out, in] (layouts ``experts_transposed``
and, for gpt-oss's interleaved gate/up columns, ``gate_up_interleaved`` in ``tensors``); AFMoE as
archlab does, and its checkpoints each expert apart (``moe.stack_saved_experts``). Nothing here
imports transformers.
"""

from __future__ import annotations

from typing import Any

from archlab.config import (
    BlockConfig,
    LayersConfig,
    MLPConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
    n_kv_head,
    with_fields,
)
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import shortest_layout
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule, fmt, out_bias
from archlab.interop.families.experts import is_dense
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.values import config_head_dim, has_field, kind_field, leaf_fields, value_of
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff

SECTIONS = ("attention", "position", "mlp")  # the parts a layer kind may override


# ---------------------------------------------------------------- layouts both ways


def apply_layout(cfg: ModelConfig, names: list[str], overrides: dict[str, dict[str, dict[str, Any]]]) -> ModelConfig:
    """``cfg`` with layer i given the kind ``names[i]``, each kind overriding the fields ``overrides[kind]``
    names; one kind for every layer is merged into the model's own parts (no ``model.layers``)."""
    used = sorted(set(names), key=names.index)
    if len(used) == 1:
        return with_fields(cfg, overrides[used[0]], "model")
    first, pattern = shortest_layout(names)
    cfg.layers = LayersConfig(kinds={k: overrides[k] for k in used}, first=first, pattern=pattern)
    return cfg


def one_window(layers: list[ModelConfig]) -> list[Problem]:
    """The one ``sliding_window`` transformers holds for all the sliding layers: two windows are refused."""
    windows = {w for lc in layers if (w := lc.attention.window) is not None}
    if len(windows) > 1:
        return [Problem("model.attention.window", sorted(windows), "one window for every sliding layer")]
    return []


def one_dense_width(cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
    """The one ``intermediate_size`` transformers holds for all the dense layers: a layer of another width is
    refused naming it (a layer without an MLP, or of a kind without ``d_ff``, is refused by its kind's rule)."""
    dense = [i for i, lc in enumerate(layers) if is_dense(lc) and has_field(lc, "model.mlp.d_ff")]
    widths = [d_ff(layers[i]) for i in dense]
    i = next((i for i, w in zip(dense, widths) if w != widths[0]), None)
    if i is None:
        return []
    return [Problem(kind_field(cfg, layer_kind(cfg, i), "model.mlp.d_ff"), widths[dense.index(i)], str(widths[0]))]


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
            if cfg.mlp.kind != "moe" or (lc.mlp.kind != "moe" and lc.mlp.kind != cfg.mlp.expert):
                wants, why = (
                    (cfg.mlp.expert, "its dense layers are of its experts' kind")
                    if cfg.mlp.kind == "moe"
                    else ("moe", "a mixture of experts")
                )
                found.append(Problem(kind_field(cfg, kind, "model.mlp.kind"), lc.mlp.kind, wants, f" ({why})"))
        for section in SECTIONS:
            for name in leaf_fields(getattr(cfg, section), f"model.{section}"):
                if name in self.varies:
                    continue
                if not all(has_field(lc, name) for _, lc in kinds):
                    continue  # a field of the MoE's that a dense layer's MLP has not: its kind differs, above
                values = [(kind, value_of(lc, name)) for kind, lc in kinds]
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
            num_experts_per_tok=cfg.mlp.routing.top_k,
            num_local_experts=cfg.mlp.routing.n_experts,
            router_aux_loss_coef=cfg.mlp.routing.aux_loss_weight,
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


# ---- Llama 4 (text)

_WIDTHS = frozenset(f"model.mlp.{f}" for f in ("d_ff", "multiplier", "ffn_dim_multiplier", "multiple_of"))


# ---- AFMoE (Arcee Trinity)
