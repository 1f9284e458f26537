"""OLMo Hybrid (``OlmoHybridForCausalLM``): OLMo 2's attention layers (post-norm: each sublayer's output
RMS-normed before the residual add; q and k RMS-normed over the whole projection; RoPE, or none as the
released checkpoints) beside pre-norm Gated DeltaNet layers (``linear_attention`` in ``layer_types``: q, k, v,
the output gate g, b and a projected apart; β doubled by ``linear_allow_neg_eigval``; the output norm's
epsilon 1e-5 whatever ``rms_norm_eps``), every layer a SwiGLU MLP.

In archlab the model's own parts are an attention layer's (``block: post_sublayer``); the kind ``deltanet``
swaps the mixer for ``gated_deltanet`` and the block for ``pre`` (a layer kind's block:
``config.layers``), ``attention`` overrides nothing; the shortest ``first`` and ``pattern``. The A_log
initialisation range (``linear_a_log_min``/``max``) is not held: it changes no logits."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from archlab.config import POSITION_OPTIONS, BlockConfig, ModelConfig, NormConfig, n_kv_head
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig, shortest_layout
from archlab.interop.families.base import (
    NO_HEAD_BIAS,
    ONE_BIAS_FLAG,
    Family,
    Problem,
    Rule,
    bare,
    first_per_field,
    out_bias,
)
from archlab.interop.families.deltanet import is_deltanet, linear_keys
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import differences, kind_field, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.gated_deltanet import GatedDeltaNetConfig, key_heads
from archlab.nn.mlp import d_ff

LINEAR, FULL = "linear_attention", "full_attention"
DELTANET, ATTENTION = "deltanet", "attention"
NOPE = {"rope_type": "default", "rope_theta": None}  # no RoPE (null rope_parameters reads as RoPE 10⁴)
O_NORM_EPS = 1e-5  # OlmoHybridRMSNormGated's epsilon, as FLA's FusedRMSNormGated: not rms_norm_eps
# the Gated DeltaNet fields an OlmoHybridConfig holds (linear_*), beside allow_neg_eigval and the dt draw
HELD = ("n_head", "key_heads", "key_head_dim", "v_head_dim", "conv_kernel", "allow_neg_eigval")
HELD += ("dt_min", "dt_max", "dt_init_floor")


def deltanet_kind(c: Any) -> dict[str, Any]:
    """The ``deltanet`` kind of an OlmoHybridConfig: its Gated DeltaNet (dt_bias drawn as Mamba-2's from
    ``linear_dt_*``, the output norm at 1e-5) in a pre-norm block."""
    attention = dict(
        kind="gated_deltanet",
        n_head=c.linear_num_value_heads,
        key_heads=c.linear_num_key_heads,
        key_head_dim=c.linear_key_head_dim,
        v_head_dim=c.linear_value_head_dim,
        conv_kernel=c.linear_conv_kernel_dim,
        allow_neg_eigval=bool(c.linear_allow_neg_eigval),
        norm_eps=O_NORM_EPS,
        dt_bias_init=None,
        dt_min=float(c.linear_dt_min),
        dt_max=float(c.linear_dt_max),
        dt_init_floor=float(c.linear_dt_init_floor),
    )
    return {"attention": attention, "block": {"kind": "pre"}}


class OlmoHybrid(Family):
    """OlmoHybridForCausalLM: see the module docstring."""

    mixer_kinds = ("gated_deltanet",)
    block_kinds = True

    model_type, title = "olmo_hybrid", "OLMo Hybrid"
    model_class, config_class = "OlmoHybridForCausalLM", "OlmoHybridConfig"
    prefix = "model."
    position_kind = ("rope", "none")
    parts = "OLMo 2's post-norm attention layers beside pre-norm Gated DeltaNet layers (β in (0, 2)), SwiGLU"
    features = frozenset({"model.layers.first", "model.layers.pattern", "model.attention.qk_norm"})
    keys = {**LLAMA_KEYS, "rms_norm_eps": "norm.eps"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        d, H = cfg.d_model, cfg.attention.n_head
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("post_sublayer",), " (its attention layers' block; the linear ones are a kind)"),
            ("model.position.pairing", ("half",), ""),
            ("model.attention.qk_norm", ("full",), " (q_norm and k_norm span the projection)"),
            ("model.attention.head_dim", (None, d // H), f" ({self.title}'s attention uses d_model / n_head)"),
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
            ("model.mlp.kind", ("swiglu",), " (hidden_act, silu, is also its linear layers' convolution's)"),
            ("model.mlp.bias", (False,), ""),
            NO_HEAD_BIAS,
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems`` of the model's own parts (an attention layer's), full RoPE, then the layer kinds:
        at least one Gated DeltaNet and one attention layer; every Gated DeltaNet layer the first one's, with
        the output norm at 1e-5, dt_bias drawn, in a pre-norm block; every other part the model's."""
        found = super().part_problems(cfg) + self.full_rotary(cfg)
        lcs = layer_configs(cfg)
        linear = next((lc for lc in lcs if is_deltanet(lc)), None)
        if linear is None or all(is_deltanet(lc) for lc in lcs):
            why = f" ({self.title} has Gated DeltaNet layers and attention layers, at least one of each)"
            return found + [Problem("model.layers.pattern", list(cfg.layers.pattern), "both kinds of layer", why)]
        want = GatedDeltaNetConfig(**{k: getattr(linear.attention, k) for k in HELD})
        want.n_head, want.norm_eps, want.dt_bias_init = linear.attention.n_head, O_NORM_EPS, None
        pre = BlockConfig(**{**vars(cfg.block), "kind": "pre"})
        for i, lc in enumerate(lcs):
            kind = layer_kind(cfg, i)
            if kind is None:
                continue
            mixer, block = (want, pre) if is_deltanet(lc) else (cfg.attention, cfg.block)
            for section, have, expected in (
                ("attention", lc.attention, mixer),
                ("block", lc.block, block),
                ("position", lc.position, cfg.position),
                ("mlp", lc.mlp, cfg.mlp),
            ):
                for name, value, wanted in differences(have, expected):
                    field = kind_field(cfg, kind, f"model.{section}.{name}")
                    found.append(
                        Problem(field, value, bare(wanted), f" ({self.title} has one of each layer)", (wanted,))
                    )
        return first_per_field(found)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs = layer_configs(cfg)
        linear = next(lc.attention for lc in lcs if is_deltanet(lc))
        return dict(
            self.keys_to_hf(cfg),
            intermediate_size=d_ff(cfg),
            num_key_value_heads=n_kv_head(cfg),
            hidden_act="silu",
            attention_bias=cfg.attention.qkv_bias,
            attention_dropout=cfg.attention.dropout,
            rope_parameters=rope_to_hf(cfg) if cfg.position.kind == "rope" else NOPE,
            layer_types=[LINEAR if is_deltanet(lc) else FULL for lc in lcs],
            **linear_keys(lcs),
            linear_allow_neg_eigval=linear.allow_neg_eigval,
            linear_dt_min=linear.dt_min,
            linear_dt_max=linear.dt_max,
            linear_dt_init_floor=linear.dt_init_floor,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "'silu' (archlab's SwiGLU; its linear layers' convolution is SiLU'd too)")
        hd = c.hidden_size // c.num_attention_heads
        rope = (c.rope_parameters or {}).get("rope_theta") is not None
        bias = bool(c.attention_bias)
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="post_sublayer"),
            position=rope_from_hf(c, hd, partial=False) if rope else POSITION_OPTIONS.make(kind="none"),
            attention=AttentionConfig(
                n_kv_head=c.num_key_value_heads,
                qkv_bias=bias,
                out_bias=bias,
                dropout=float(c.attention_dropout or 0.0),
                qk_norm="full",
            ),
            mlp=mlp_section("swiglu", bias=False, d_ff=c.intermediate_size),
        )
        cfg = self.keys_from_hf(c, cfg)
        names = [DELTANET if t == LINEAR else ATTENTION for t in c.layer_types]
        kinds = {DELTANET: deltanet_kind(c), ATTENTION: {}}
        first, pattern = shortest_layout(names)
        cfg.layers = LayersConfig(kinds={k: kinds[k] for k in dict.fromkeys(names)}, first=first, pattern=pattern)
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for i, lc in enumerate(layer_configs(cfg)):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            if is_deltanet(lc):
                a, ours, theirs = lc.attention, f"{b}.attn", f"{h}.linear_attn"
                t.add(f"{b}.attn_norm", f"{h}.input_layernorm")
                t.add(f"{b}.mlp_norm", f"{h}.post_attention_layernorm")
                qk, H, dv = key_heads(lc) * a.key_head_dim, a.n_head, a.v_head_dim
                names = [f"{theirs}.{x}_proj" for x in "qkvgba"]
                t.stacked(f"{ours}.in_proj", names, False, (qk, qk, H * dv, H * dv, H, H))
                t.maps.append(TensorMap(f"{ours}.conv_weight", (f"{theirs}.conv1d.weight",), "depthwise_conv"))
                for name in ("A_log", "dt_bias"):
                    t.maps.append(TensorMap(f"{ours}.{name}", (f"{theirs}.{name}",)))
                t.maps.append(TensorMap(f"{ours}.norm_weight", (f"{theirs}.o_norm.weight",)))
                t.add(f"{ours}.proj", f"{theirs}.o_proj")
            else:
                t.add(f"{b}.attn_out_norm", f"{h}.post_attention_layernorm")
                t.add(f"{b}.mlp_out_norm", f"{h}.post_feedforward_layernorm")
                a, attn = cfg.attention, f"{h}.self_attn"
                t.qkv(f"{b}.attn.qkv", attn, a.qkv_bias)
                t.add(f"{b}.attn.q_norm", f"{attn}.q_norm")
                t.add(f"{b}.attn.k_norm", f"{attn}.k_norm")
                t.add(f"{b}.attn.proj", f"{attn}.o_proj", a.out_bias)
            t.gate_up(f"{b}.mlp.gate_up", f"{h}.mlp", False)
            t.add(f"{b}.mlp.down", f"{h}.mlp.down_proj")
        t.add("final_norm", "model.norm")
        return t.head()

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Checkpoints name the first norm of every layer ``attention_layer_norm`` and the second
        ``feedforward_layer_norm``, and keep q, k and v's convolutions apart: renamed and joined as
        transformers loads them."""
        for old, new in (
            ("attention_layer_norm", "input_layernorm"),
            ("feedforward_layer_norm", "post_attention_layernorm"),
        ):
            state = {k.replace(f".{old}.", f".{new}."): v for k, v in state.items()}
        for i in range(cfg.n_layer):
            h = f"model.layers.{i}.linear_attn"
            apart = [f"{h}.{x}_conv1d.weight" for x in "qkv"]
            if all(n in state for n in apart):
                state[f"{h}.conv1d.weight"] = torch.cat([state.pop(n) for n in apart])
        return state


RECORDS: tuple[Family, ...] = (OlmoHybrid(),)
