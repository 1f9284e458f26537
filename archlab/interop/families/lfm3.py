"""LFM3 (``Lfm3ForCausalLM``, Liquid AI 2026): LFM2's gated short convolutions (``conv``) beside two kinds of
Qwen3 attention, ``sliding_attention`` (a window of ``sliding_window``, its own RoPE) and ``full_attention``
(its own RoPE: by default ``proportional``, archlab's ``turning_fraction``), each with a per-head QK-norm
before RoPE and, where ``use_attention_gate``, each head's output times ``sigmoid(g_proj(x))`` (archlab's
``gate: head``); then a SwiGLU of ``intermediate_size`` (``w1``, ``w3``, ``w2``). With ``use_sandwich_norm``
each sublayer's output is RMS-normed before the residual sum (archlab's ``sandwich`` block), else ``pre``.

In archlab the model's own attention and RoPE are the full layers'; kinds ``conv`` (the short convolution),
``sliding`` (the window and the RoPE fields that differ) and ``attention`` (overriding nothing), in the
shortest ``first`` and ``pattern``. ``rope_parameters`` holds one set per attention layer type: ``default``
(whole heads) or ``proportional`` (its ``partial_rotary_factor`` the turning fraction), unscaled. Checkpoints
name the gate ``gate_proj``: renamed on loading, as transformers does."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from archlab.config import BlockConfig, HeadConfig, ModelConfig, NormConfig, n_kv_head
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig, shortest_layout
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
from archlab.interop.families.layered import rope_of
from archlab.interop.families.lfm2 import CONV, CONV_T, FULL_T, is_conv, lfm_tensors
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.tensors import TensorMap
from archlab.interop.families.values import differences, refuse_hf
from archlab.interop.families.windows import SLIDING
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.rope import RoPEConfig

SLIDING_K, ATTENTION = "sliding", "attention"  # archlab's layer kinds of the two attention types
PROPORTIONAL_KEYS = {"rope_type", "rope_theta", "partial_rotary_factor"}


def rope_from_lfm3(c: Any, t: str, hd: int) -> RoPEConfig:
    """archlab's RoPE of layer type ``t``'s rope_parameters: ``proportional`` as ``turning_fraction``, else as
    the LLaMA families read it (``default``, whole heads)."""
    params = dict((c.rope_parameters or {}).get(t) or {})
    if params.get("rope_type") != "proportional":
        position = rope_of(c, params, hd, t)
        if position.scaling.kind != "none":
            refuse_hf(
                c, f"rope_parameters.{t}.rope_type", "'default' or 'proportional' (unscaled)", params["rope_type"]
            )
        return position
    for key in sorted(set(params) - PROPORTIONAL_KEYS):
        refuse_hf(c, f"rope_parameters.{t}.{key}", "absent for rope_type='proportional' (archlab's is unscaled)")
    fraction = float(params.get("partial_rotary_factor", 1.0))
    return RoPEConfig(
        theta=float(params.get("rope_theta", c.default_theta)),
        pairing="half",
        turning_fraction=None if fraction == 1.0 else fraction,
    )


def rope_to_lfm3(p: RoPEConfig) -> dict[str, Any]:
    """transformers' rope_parameters of one layer type."""
    if p.turning_fraction is None:
        return {"rope_type": "default", "rope_theta": p.theta}
    return {"rope_type": "proportional", "rope_theta": p.theta, "partial_rotary_factor": p.turning_fraction}


class Lfm3(Family):
    """Lfm3ForCausalLM: see the module docstring."""

    mixer_kinds = ("short_conv",)
    model_type, title, model_class, config_class = "lfm3", "LFM3", "Lfm3ForCausalLM", "Lfm3Config"
    prefix = "model."
    defers = True  # to LFM2, which holds its layouts without sandwich norms, gates or windows
    parts = "gated short-convolution, sliding and full Qwen3-attention layers (head gate, proportional RoPE), SwiGLU, sandwich norms"
    features = LAYERS | {
        "model.attention.qk_norm",
        "model.attention.gate",
        "model.attention.window",
        "model.position.turning_fraction",
    }
    keys = {**LLAMA_KEYS, "norm_eps": "norm.eps", "attention_dropout": "attention.dropout"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        a = cfg.attention
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre", "sandwich"), " (use_sandwich_norm)"),
            NO_HEAD_BIAS,
            ("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)"),
            ("model.attention.gate", ("none", "head"), " (g_proj: one sigmoid gate per head)"),
            ("model.attention.qkv_bias", (False,) if a.gate != "none" else (False, True), " (g_proj has no bias)"),
            out_bias(a.qkv_bias, ONE_BIAS_FLAG),
            ("model.mlp.kind", ("swiglu",), " (w1, w3, w2: a SiLU-gated MLP)"),
            ("model.mlp.bias", (False,), ""),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems`` of the model's own parts (its full layers'), then each layer kind's: a
        convolution whose fields differ from the first one's; a sliding layer whose attention differs from the
        model's but for its window, whose window or RoPE differs from the first sliding layer's; a full layer
        whose attention or RoPE differs from the model's; an MLP that differs; RoPE other than half-paired,
        unscaled, over whole heads (each named as the layer's kind sets it)."""
        lcs = layer_configs(cfg)
        conv = next((lc.attention for lc in lcs if is_conv(lc)), None)
        sliding = next((lc for lc in lcs if not is_conv(lc) and lc.attention.window is not None), None)
        layered: list[Problem] = []
        for i, lc in enumerate(lcs):
            kind = layer_kind(cfg, i)
            if is_conv(lc):
                wanted = [("attention", lc.attention, conv, "one short convolution for every such layer")]
            elif lc.attention.window is not None and sliding is not None:
                same = dataclasses.replace(cfg.attention, window=sliding.attention.window)
                why = "one attention, and one window and RoPE for every sliding layer"
                wanted = [("attention", lc.attention, same, why), ("position", lc.position, sliding.position, why)]
            else:
                why = "one attention and RoPE for every full layer"
                wanted = [("attention", lc.attention, cfg.attention, why), ("position", lc.position, cfg.position, why)]
            wanted.append(("mlp", lc.mlp, cfg.mlp, "one MLP"))
            if lc.position.kind == "rope" and not is_conv(lc):
                plain = RoPEConfig(theta=lc.position.theta, turning_fraction=lc.position.turning_fraction)
                wanted.append(("position", lc.position, plain, "RoPE half-paired, unscaled, over whole heads"))
            layered.extend(section_problems(cfg, kind, wanted, self.title))
        return first_per_field(super().part_problems(cfg) + layered)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs = layer_configs(cfg)
        conv = next((lc.attention for lc in lcs if is_conv(lc)), None)
        sliding = next((lc for lc in lcs if not is_conv(lc) and lc.attention.window is not None), None)
        types = [CONV_T if is_conv(lc) else SLIDING if lc.attention.window is not None else FULL_T for lc in lcs]
        full = rope_to_lfm3(cfg.position)
        out = dict(
            self.keys_to_hf(cfg),
            num_key_value_heads=n_kv_head(cfg),
            head_dim=head_dim(cfg),
            intermediate_size=d_ff(cfg),
            layer_types=types,
            rope_parameters={FULL_T: full, SLIDING: full if sliding is None else rope_to_lfm3(sliding.position)},
            sliding_window=None if sliding is None else sliding.attention.window,
            use_sandwich_norm=cfg.block.kind == "sandwich",
            use_attention_gate=cfg.attention.gate == "head",
            attention_bias=cfg.attention.qkv_bias,
        )
        if conv is not None:
            out.update(conv_L_cache=conv.conv_kernel, conv_bias=conv.bias)
        return out

    def from_hf(self, c: Any) -> ModelConfig:
        types = list(c.layer_types)
        if len(types) != c.num_hidden_layers or set(types) - {CONV_T, SLIDING, FULL_T}:
            refuse_hf(c, "layer_types", f"num_hidden_layers entries, each '{CONV_T}', '{SLIDING}' or '{FULL_T}'", types)
        gate, bias = bool(c.use_attention_gate), bool(c.attention_bias)
        if gate and bias:
            refuse_hf(
                c, "attention_bias", "false with use_attention_gate (archlab's gate has q/k/v's bias, g_proj none)"
            )
        attention = AttentionConfig(
            n_kv_head=c.num_key_value_heads,
            head_dim=c.head_dim,
            qkv_bias=bias,
            out_bias=bias,
            qk_norm="head",
            gate="head" if gate else "none",
        )
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="sandwich" if c.use_sandwich_norm else "pre"),
            position=rope_from_lfm3(c, FULL_T, c.head_dim),
            attention=attention,
            mlp=mlp_section("swiglu", d_ff=c.intermediate_size, bias=False),
            head=HeadConfig(bias=False),
        )
        cfg = self.keys_from_hf(c, cfg)
        cfg.attention.dropout = float(cfg.attention.dropout)
        names = [{CONV_T: CONV, SLIDING: SLIDING_K, FULL_T: ATTENTION}[t] for t in types]
        kinds: dict[str, dict[str, Any]] = {name: {} for name in dict.fromkeys(names)}
        if CONV in kinds:
            kinds[CONV] = {"attention": dict(kind="short_conv", conv_kernel=c.conv_L_cache, bias=bool(c.conv_bias))}
        if SLIDING_K in kinds:
            kinds[SLIDING_K] = {"attention": {"window": c.sliding_window}}
            own = rope_from_lfm3(c, SLIDING, c.head_dim)
            position = {name: value for name, value, _ in differences(own, cfg.position)}
            if position:
                kinds[SLIDING_K]["position"] = position
        first, pattern = shortest_layout(names)
        cfg.layers = LayersConfig(kinds=kinds, first=first, pattern=pattern)
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return lfm_tensors(cfg, qk_norms=("q_norm", "k_norm"), out="o_proj")

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The gate as checkpoints name it (``self_attn.gate_proj``) renamed ``g_proj``, as transformers does."""
        return {k.replace(".self_attn.gate_proj.", ".self_attn.g_proj."): v for k, v in state.items()}


RECORDS: tuple[Family, ...] = (Lfm3(),)
