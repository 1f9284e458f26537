"""Bamba (``BambaForCausalLM``, IBM's Mamba-2 hybrid): pre-norm layers of two RMSNorms, each mixing tokens by
Mamba-2 (``BambaMixer``, archlab's ``mamba2``) or, at ``attn_layer_indices``, by GQA attention with RoPE on
half of each head (transformers hard-codes ``partial_rotary_factor`` 0.5), then a SwiGLU MLP.

In archlab the model's own parts are the attention layers' and the Mamba-2 layers are a kind,
``model.layers``: ``mamba2`` (the causal fields mamba2 refuses reset, as ``model/layers=mamba2_all``, and
the ``mamba_*`` sizes) and, where some layers attend, ``attention`` (overriding nothing); the first layers
in ``first`` and the rest in a cycled ``pattern``, the shortest pair that gives every layer its kind. A
layout with no Mamba-2 layer is an attention family's, not Bamba's. ``z_loss_coefficient`` (a training
loss) and ``num_logits_to_keep`` (generation) change no logits and are not read."""

from __future__ import annotations

import math
from typing import Any, cast

from archlab.config import (
    MIXER_OPTIONS,
    BlockConfig,
    HeadConfig,
    ModelConfig,
    NormConfig,
    n_kv_head,
)
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig, shortest_layout
from archlab.interop.families.base import (
    NO_HEAD_BIAS,
    ONE_BIAS_FLAG,
    Family,
    Problem,
    Rule,
    first_per_field,
    out_bias,
    section_problems,
)
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, kind_field, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mixers.mamba2 import Mamba2Config, inner
from archlab.nn.mixers.mamba2 import head_dim as mamba_head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.rope import rotary_dim

MAMBA, ATTENTION = "mamba2", "attention"
# the Mamba-2 fields a Bamba config holds (mamba_*, time_step_limit); out_bias follows qkv_bias (one flag)
HELD = ("n_head", "head_dim", "state_size", "groups", "conv_kernel", "conv_bias", "scan_chunk", "qkv_bias")
HELD += ("dt_limit_min", "dt_limit_max")


def is_mamba(lc: ModelConfig) -> bool:
    return lc.attention.kind == "mamba2"


def mamba_kind(a: Mamba2Config, d_model: int, held: tuple[str, ...] = HELD) -> dict[str, Any]:
    """The fields of the ``mamba2`` kind of Mamba-2 mixer ``a``: its kind and the fields ``held`` (what a Bamba
    config holds); head_dim only where it is not 2·d_model/n_head, the biases only where set and the time-step
    clamp only where set (the values a kind leaves out), so ``BambaConfig()`` reads as the ``bamba-9b`` preset
    writes it."""
    out = dict(kind=MAMBA, **{name: getattr(a, name) for name in held}, out_bias=a.qkv_bias)
    if a.head_dim is None or a.head_dim * a.n_head == 2 * d_model:
        del out["head_dim"]
    if not a.qkv_bias:  # Mamba-2's own default: no projection biases
        del out["qkv_bias"], out["out_bias"]
    if a.dt_limit_min == 0.0 and a.dt_limit_max is None:
        del out["dt_limit_min"], out["dt_limit_max"]
    return out


def hybrid_problems(cfg: ModelConfig, title: str, held: tuple[str, ...] = HELD) -> list[Problem]:
    """What the layer kinds of a Mamba-2 hybrid (Bamba, GraniteMoeHybrid) set that its config cannot hold:
    no Mamba-2 layer, an inner width that is not a multiple of d_model, a Mamba-2 layer whose sizes differ
    from the first one's or that sets a field the config has no key for (the kind holds the fields
    ``held``), an attention layer whose attention or RoPE differs from the model's, an MLP that
    differs from the model's (each named as the layer's kind sets it)."""
    found: list[Problem] = []
    lcs = layer_configs(cfg)
    first = next((lc for lc in lcs if is_mamba(lc)), None)
    if first is None:
        why = f" ({title} is a Mamba-2 hybrid: a layout without Mamba-2 layers is an attention family's)"
        return [Problem("model.layers.pattern", list(cfg.layers.pattern), "a kind of mamba2 attention", why)]
    mamba = cast(Mamba2Config, MIXER_OPTIONS.build(mamba_kind(first.attention, cfg.d_model, held), "model.attention"))
    mamba.head_dim = first.attention.head_dim
    kind = layer_kind(cfg, lcs.index(first))
    if inner(first) % cfg.d_model:
        whole = [cfg.d_model * k // mamba.n_head for k in range(1, 5) if cfg.d_model * k % mamba.n_head == 0]
        why = f" (n_head·head_dim is mamba_expand·hidden_size: a multiple of d_model={cfg.d_model})"
        field = kind_field(cfg, kind, "model.attention.head_dim")
        found.append(Problem(field, mamba_head_dim(first), " or ".join(map(str, whole)), why))
    layered: list[Problem] = []
    for i, lc in enumerate(lcs):
        kind = layer_kind(cfg, i)
        if kind is None:
            continue
        wanted = [
            ("attention", lc.attention, mamba, "one set of Mamba-2 sizes for every such layer, no dt init range")
            if is_mamba(lc)
            else ("attention", lc.attention, cfg.attention, "one attention for every attention layer"),
            ("position", lc.position, cfg.position, "one RoPE for every layer"),
            ("mlp", lc.mlp, cfg.mlp, "one MLP for every layer"),
        ]
        layered.extend(section_problems(cfg, kind, wanted, title))
    return found + first_per_field(layered)


def mamba_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The ``mamba_*`` keys and ``time_step_limit`` of the first Mamba-2 layer (every one alike)."""
    lc = next(lc for lc in layer_configs(cfg) if is_mamba(lc))
    m = lc.attention
    return dict(
        mamba_n_heads=m.n_head,
        mamba_d_head=mamba_head_dim(lc),
        mamba_expand=inner(lc) // cfg.d_model,
        mamba_n_groups=m.groups,
        mamba_d_state=m.state_size,
        mamba_d_conv=m.conv_kernel,
        mamba_chunk_size=m.scan_chunk,
        mamba_conv_bias=m.conv_bias,
        mamba_proj_bias=m.qkv_bias,
        time_step_limit=(m.dt_limit_min, math.inf if m.dt_limit_max is None else m.dt_limit_max),
    )


def hybrid_layers(c: Any, names: list[str]) -> LayersConfig:
    """The layout of layers ``names`` (``mamba2`` or ``attention`` each): the ``mamba2`` kind of the config's
    ``mamba_*`` keys and ``time_step_limit``, an ``attention`` kind overriding nothing where a layer attends,
    the shortest ``first`` and ``pattern``; none where every layer attends."""
    if MAMBA not in names:
        return LayersConfig()
    low, high = c.time_step_limit
    proj_bias = bool(c.mamba_proj_bias)
    mamba = Mamba2Config(
        n_head=c.mamba_n_heads,
        head_dim=c.mamba_d_head,
        qkv_bias=proj_bias,
        out_bias=proj_bias,
        state_size=c.mamba_d_state,
        groups=c.mamba_n_groups,
        conv_kernel=c.mamba_d_conv,
        conv_bias=bool(c.mamba_conv_bias),
        scan_chunk=c.mamba_chunk_size,
        dt_limit_min=float(low),
        dt_limit_max=None if math.isinf(high) else float(high),
    )
    kinds: dict[str, dict[str, Any]] = {MAMBA: {"attention": mamba_kind(mamba, c.hidden_size)}}
    if ATTENTION in names:
        kinds[ATTENTION] = {}
    first, pattern = shortest_layout(names)
    return LayersConfig(kinds=kinds, first=first, pattern=pattern)


def hybrid_tensors(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """A layer's mixer: Mamba-2 at ``<hf>.mamba``, else q/k/v and o_proj at ``<hf>.self_attn``."""
    if is_mamba(lc):
        mamba_tensors(t, lc, archlab, f"{hf}.mamba")
    else:
        t.qkv(f"{archlab}.qkv", f"{hf}.self_attn", lc.attention.qkv_bias)
        t.add(f"{archlab}.proj", f"{hf}.self_attn.o_proj", lc.attention.out_bias)


class Bamba(Family):
    """BambaForCausalLM: see the module docstring."""

    mixer_kinds = ("mamba2",)

    model_type, title, model_class, config_class = "bamba", "Bamba", "BambaForCausalLM", "BambaConfig"
    prefix = "model."
    parts = "Mamba-2 layers and GQA layers with RoPE on half of each head, SwiGLU MLPs, pre-norm RMSNorm"
    features = frozenset({"model.layers.first", "model.layers.pattern"})
    keys = {
        **LLAMA_KEYS,
        "rms_norm_eps": "norm.eps",
        "attention_dropout": "attention.dropout",
    }

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        a, d, H = cfg.attention, cfg.d_model, cfg.attention.n_head
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre",), ""),
            NO_HEAD_BIAS,
            ("model.position.pairing", ("half",), ""),
            ("model.attention.head_dim", (None, d // H), f" ({self.title}'s attention uses d_model / n_head)"),
            out_bias(a.qkv_bias, ONE_BIAS_FLAG),
            ("model.mlp.kind", ("swiglu",), " (hidden_act, silu, is also its Mamba-2 convolution's)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems`` of the model's own parts (its attention layers'), RoPE on half of each head, at
        least one Mamba-2 layer, then what its layer kinds set that Bamba cannot hold: a Mamba-2 layer whose
        sizes differ from the first one's or that sets a field a Bamba config has no key for, an attention
        layer whose attention or RoPE differs from the model's, an MLP that differs from the model's (each
        named as the layer's kind sets it)."""
        found = super().part_problems(cfg)
        half = head_dim(cfg) // 2
        if cfg.position.kind == "rope" and rotary_dim(cfg) != half:  # another scheme: refused as such
            field, value = (
                ("model.position.rotary_dim", cfg.position.rotary_dim)
                if cfg.position.rotary_dim is not None
                else ("model.position.rotary_fraction", cfg.position.rotary_fraction)
            )
            why = f" ({self.title} rotates half of each head: partial_rotary_factor 0.5, hard-coded)"
            found.append(Problem(field, value, f"0.5 (rotary_fraction) or {half} (rotary_dim)", why))
        return found + hybrid_problems(cfg, self.title)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        attention = [i for i, lc in enumerate(layer_configs(cfg)) if not is_mamba(lc)]
        return dict(
            self.keys_to_hf(cfg),
            intermediate_size=d_ff(cfg),
            num_key_value_heads=n_kv_head(cfg),
            hidden_act="silu",
            attention_bias=cfg.attention.qkv_bias,
            mlp_bias=cfg.mlp.bias,
            rope_parameters=rope_to_hf(cfg, 0.5),
            attn_layer_indices=attention or None,
            **mamba_to_hf(cfg),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "'silu' (archlab's SwiGLU; its Mamba-2 convolution is SiLU'd too)")
        n = c.num_hidden_layers
        indices = list(c.attn_layer_indices or [])
        if any(not isinstance(i, int) or not 0 <= i < n for i in indices):
            refuse_hf(c, "attn_layer_indices", f"layer indices in [0, num_hidden_layers={n})", indices)
        hd, bias = config_head_dim(c), bool(c.attention_bias)
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="pre"),
            position=rope_from_hf(c, hd, partial=True, scalings=("default",)),
            attention=AttentionConfig(n_kv_head=c.num_key_value_heads, qkv_bias=bias, out_bias=bias),
            mlp=mlp_section("swiglu", approximate="none", bias=bool(c.mlp_bias)),
            head=HeadConfig(bias=False),
        )
        cfg = self.keys_from_hf(c, cfg)
        cfg.mlp.d_ff = c.intermediate_size
        cfg.attention.dropout = float(cfg.attention.dropout)
        cfg.layers = hybrid_layers(c, [ATTENTION if i in indices else MAMBA for i in range(n)])
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for lc, b, h in t.layers(attn_norm="input_layernorm", mlp_norm="pre_ff_layernorm"):
            hybrid_tensors(t, lc, f"{b}.attn", h)
            t.gate_up(f"{b}.mlp.gate_up", f"{h}.feed_forward", lc.mlp.bias)
            t.add(f"{b}.mlp.down", f"{h}.feed_forward.down_proj", lc.mlp.bias)
        t.add("final_norm", "model.final_layernorm")
        return t.head()


def mamba_tensors(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """A Mamba-2 mixer's tensors, each as it is: in_proj [z | x, B, C | dt], conv1d, dt_bias, A_log, D, the
    gated norm (where it has one: ``gate_norm`` not none), out_proj."""
    a = lc.attention
    t.add(f"{archlab}.in_proj", f"{hf}.in_proj", a.qkv_bias)
    t.maps.append(TensorMap(f"{archlab}.conv_weight", (f"{hf}.conv1d.weight",)))
    if a.conv_bias:
        t.maps.append(TensorMap(f"{archlab}.conv_bias", (f"{hf}.conv1d.bias",)))
    for name in ("dt_bias", "A_log", "D"):
        t.maps.append(TensorMap(f"{archlab}.{name}", (f"{hf}.{name}",)))
    if a.gate_norm != "none":
        t.maps.append(TensorMap(f"{archlab}.norm_weight", (f"{hf}.norm.weight",)))
    t.add(f"{archlab}.proj", f"{hf}.out_proj", a.out_bias)


RECORDS: tuple[Family, ...] = (Bamba(),)
