"""LFM2 (``Lfm2ForCausalLM``) and LFM2-MoE (``Lfm2MoeForCausalLM``), Liquid AI 2025: pre-norm layers of two
RMSNorms, each mixing tokens by a gated short convolution (``conv``: archlab's ``short_conv``) or by GQA
attention with a per-head QK-norm before full RoPE and no biases (``full_attention``), as ``layer_types``
says; then a SwiGLU MLP (``w1`` the gate, ``w3`` the up projection, ``w2`` down), or in LFM2-MoE past the first
``num_dense_layers`` a MoE: sigmoid scores, top-k picked by the scores plus ``expert_bias`` (a selection-only
correction bias) where ``use_expert_bias``, renormalised as ``norm_topk_prob`` says, times
``routed_scaling_factor``, no shared experts. The final norm is named ``embedding_norm``.

LFM2's MLP width is ``intermediate_size`` through ``block_auto_adjust_ff_dim``'s rule (two thirds of it, times
``block_ffn_dim_multiplier``, rounded up to ``block_multiple_of``): read as the explicit d_ff it gives, written
back as that width with the rule off. In archlab the model's own parts are the attention layers' and each layer
is of a kind, ``model.layers``: ``conv`` (the short convolution, ``conv_L_cache`` wide, ``conv_bias`` on its
projections and convolution) or ``attention`` (overriding nothing), ``_dense`` added to a dense first layer of
LFM2-MoE; the first layers in ``first`` and the rest in a cycled ``pattern``, the shortest pair. LFM2-MoE's
router renormalises by the sum + 1e-6 (archlab's: + 1e-20), a relative difference of 1e-6 at most."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import BlockConfig, HeadConfig, ModelConfig, NormConfig, n_kv_head
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig, shortest_layout
from archlab.interop.families.base import (
    LAYERS,
    NO_HEAD_BIAS,
    Family,
    Problem,
    Rule,
    first_per_field,
    out_bias,
    section_problems,
    ungrouped,
)
from archlab.interop.families.experts import dense_first, is_dense, stack_saved_experts
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import dense_of, mlp_section
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, kind_field, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width

CONV_T, FULL_T = "conv", "full_attention"  # transformers' layer_types
CONV, ATTENTION, DENSE = "conv", "attention", "_dense"  # archlab's layer kinds (names)


def is_conv(lc: ModelConfig) -> bool:
    return lc.attention.kind == "short_conv"


def auto_width(c: Any) -> int:
    """The MLP width LFM2 builds from ``intermediate_size`` (``Lfm2MLP``): with ``block_auto_adjust_ff_dim``,
    int(2/3 of it) times ``block_ffn_dim_multiplier`` (a number: the config refuses null), rounded up to
    ``block_multiple_of``; else ``intermediate_size`` itself."""
    f, m = c.intermediate_size, c.block_multiple_of
    if not c.block_auto_adjust_ff_dim:
        return f
    f = int(c.block_ffn_dim_multiplier * int(2 * f / 3))
    return m * ((f + m - 1) // m)


def lfm_layers(c: Any, n_dense: int) -> LayersConfig:
    """The layout of ``layer_types``: a ``conv`` or ``attention`` kind per layer, ``_dense`` added to the first
    ``n_dense`` (LFM2-MoE's dense layers: one SwiGLU of the model's d_ff); the shortest first and pattern."""
    types = list(c.layer_types)
    if len(types) != c.num_hidden_layers or set(types) - {CONV_T, FULL_T}:
        refuse_hf(c, "layer_types", f"num_hidden_layers entries, each '{CONV_T}' or '{FULL_T}'", types)
    names = [(CONV if t == CONV_T else ATTENTION) + (DENSE if i < n_dense else "") for i, t in enumerate(types)]
    conv = dict(kind="short_conv", conv_kernel=c.conv_L_cache, bias=bool(c.conv_bias))
    kinds: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(names):
        kinds[name] = {"attention": dict(conv)} if name.startswith(CONV) else {}
        if name.endswith(DENSE):
            kinds[name]["mlp"] = {"kind": "swiglu"}
    first, pattern = shortest_layout(names)
    return LayersConfig(kinds=kinds, first=first, pattern=pattern)


def lfm_tensors(
    cfg: ModelConfig, qk_norms: tuple[str, str] = ("q_layernorm", "k_layernorm"), out: str = "out_proj"
) -> list[TensorMap]:
    """The tensors of LFM2, LFM2-MoE and LFM3 (its attention's QK-norms ``qk_norms`` and output ``out`` named as
    Qwen3's, its head gate ``g_proj``, its sandwich norms ``post_operator_norm`` and ``post_ffn_norm``): the
    norms, a short convolution's ``conv`` or attention's ``self_attn``, the SwiGLU ``feed_forward`` (w1, w3, w2)
    or MoE (``gate``, ``expert_bias``, stacked experts), the final ``embedding_norm``."""
    t = Tensors(cfg)
    t.add("tok_emb", "model.embed_tokens")
    for lc, b, h in t.layers(attn_norm="operator_norm", mlp_norm="ffn_norm"):
        if cfg.block.kind == "sandwich":
            t.add(f"{b}.attn_out_norm", f"{h}.post_operator_norm")
            t.add(f"{b}.mlp_out_norm", f"{h}.post_ffn_norm")
        a = lc.attention
        if is_conv(lc):
            t.add(f"{b}.attn.in_proj", f"{h}.conv.in_proj", a.bias)
            t.maps.append(TensorMap(f"{b}.attn.conv_weight", (f"{h}.conv.conv.weight",)))
            if a.bias:
                t.maps.append(TensorMap(f"{b}.attn.conv_bias", (f"{h}.conv.conv.bias",)))
            t.add(f"{b}.attn.out_proj", f"{h}.conv.out_proj", a.bias)
        else:
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", a.qkv_bias)
            t.add(f"{b}.attn.q_norm", f"{h}.self_attn.{qk_norms[0]}")
            t.add(f"{b}.attn.k_norm", f"{h}.self_attn.{qk_norms[1]}")
            t.add(f"{b}.attn.proj", f"{h}.self_attn.{out}", a.out_bias)
            if a.gate != "none":
                t.add(f"{b}.attn.gate", f"{h}.self_attn.g_proj")
        m, f = f"{h}.feed_forward", d_ff(lc)
        if lc.mlp.kind == "moe":
            t.add(f"{b}.mlp.router", f"{m}.gate")
            if lc.mlp.routing.correction_bias:
                t.maps.append(TensorMap(f"{b}.mlp.router_bias", (f"{m}.expert_bias",)))
            t.maps.append(TensorMap(f"{b}.mlp.experts.gate_up", (f"{m}.experts.gate_up_proj",)))
            t.maps.append(TensorMap(f"{b}.mlp.experts.down", (f"{m}.experts.down_proj",)))
        else:
            t.stacked(f"{b}.mlp.gate_up", [f"{m}.w1", f"{m}.w3"], False, (f, f))
            t.add(f"{b}.mlp.down", f"{m}.w2")
    t.add("final_norm", "model.embedding_norm")
    return t.head()


class _Lfm(Family):
    """What LFM2 and LFM2-MoE share: the attention and short-convolution layers, their norms and names."""

    mixer_kinds = ("short_conv",)
    prefix = "model."
    features = frozenset({"model.attention.qk_norm", "model.position.scaling.kind"}) | LAYERS
    keys = {**LLAMA_KEYS, "norm_eps": "norm.eps"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre",), ""),
            NO_HEAD_BIAS,
            ("model.position.pairing", ("half",), ""),
            ("model.attention.qk_norm", ("head",), " (q_layernorm and k_layernorm span one head)"),
            ("model.attention.qkv_bias", (False,), " (its attention has no biases)"),
            out_bias(False, " (its attention has no biases)"),
            ("model.attention.dropout", (0.0,), " (its attention has no dropout)"),
            *self.mlp_rules(cfg),
        ]

    def mlp_rules(self, cfg: ModelConfig) -> list[Rule]:
        raise NotImplementedError

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems`` of the model's own parts (its attention layers'), whole-head RoPE, then what
        its layer kinds set that the family cannot hold: a convolution whose fields differ from the first
        one's, an attention layer whose attention or RoPE differs from the model's, an MLP that differs from
        the model's (a dense first layer's from ``dense_of`` the model's MoE; a dense layer after a MoE one),
        each named as the layer's kind sets it."""
        found = super().part_problems(cfg) + self.full_rotary(cfg)
        lcs = layer_configs(cfg)
        conv = next((lc.attention for lc in lcs if is_conv(lc)), None)
        n_dense = dense_first(lcs) if cfg.mlp.kind == "moe" else 0
        layered: list[Problem] = []
        for i, lc in enumerate(lcs):
            kind = layer_kind(cfg, i)
            if kind is None:
                continue
            if cfg.mlp.kind == "moe" and is_dense(lc) and i >= n_dense:
                why = f" ({self.title}'s dense layers are its first ones, before every MoE layer)"
                layered.append(Problem(kind_field(cfg, kind, "model.mlp.kind"), lc.mlp.kind, "moe", why))
            mixer = (
                ("one short convolution for every such layer", conv)
                if is_conv(lc)
                else ("one attention", cfg.attention)
            )
            mlp = dense_of(cfg.mlp) if cfg.mlp.kind == "moe" and is_dense(lc) else cfg.mlp
            wanted = [
                ("attention", lc.attention, mixer[1], mixer[0]),
                ("position", lc.position, cfg.position, "one RoPE"),
                ("mlp", lc.mlp, mlp, "one MLP, and dense first layers of the experts' kind and d_ff"),
            ]
            layered.extend(section_problems(cfg, kind, wanted, self.title))
        return found + first_per_field(layered)

    def common_to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs = layer_configs(cfg)
        conv = next((lc.attention for lc in lcs if is_conv(lc)), None)
        out = dict(
            self.keys_to_hf(cfg),
            num_key_value_heads=n_kv_head(cfg),
            head_dim=head_dim(cfg),  # not a declared key: the classes read it where set, else d / heads
            rope_parameters=rope_to_hf(cfg),
            layer_types=[CONV_T if is_conv(lc) else FULL_T for lc in lcs],
        )
        if conv is not None:
            out.update(conv_L_cache=conv.conv_kernel, conv_bias=conv.bias)
        return out

    def common_from_hf(self, c: Any, mlp: Any) -> ModelConfig:
        hd = config_head_dim(c)
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="pre"),
            position=rope_from_hf(c, hd, partial=False, scalings=("default", "linear", "llama3")),
            attention=AttentionConfig(
                n_kv_head=c.num_key_value_heads, head_dim=hd, qkv_bias=False, out_bias=False, qk_norm="head"
            ),
            mlp=mlp,
            head=HeadConfig(bias=False),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return lfm_tensors(cfg)


class Lfm2(_Lfm):
    """Lfm2ForCausalLM: see the module docstring."""

    model_type, title, model_class, config_class = "lfm2", "LFM2", "Lfm2ForCausalLM", "Lfm2Config"
    parts = (
        "gated short-convolution and GQA layers (per-head QK-norm, RoPE) by layer_types, SwiGLU MLPs, pre-norm RMSNorm"
    )

    def mlp_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [("model.mlp.kind", ("swiglu",), " (w1, w3, w2: a SiLU-gated MLP)"), ("model.mlp.bias", (False,), "")]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(self.common_to_hf(cfg), intermediate_size=d_ff(cfg), block_auto_adjust_ff_dim=False)

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = self.common_from_hf(c, mlp_section("swiglu", d_ff=auto_width(c), bias=False))
        cfg.layers = lfm_layers(c, 0)
        return cfg


class Lfm2Moe(_Lfm):
    """Lfm2MoeForCausalLM: see the module docstring."""

    model_type, title, model_class, config_class = "lfm2_moe", "LFM2-MoE", "Lfm2MoeForCausalLM", "Lfm2MoeConfig"
    parts = "LFM2's layers over a sigmoid top-k MoE with an expert bias for selection, dense first layers"

    def mlp_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.mlp.kind", ("moe",), ""),
            ("model.mlp.expert", ("swiglu",), " (its experts are SiLU-gated)"),
            ("model.mlp.bias", (False,), " (its experts have no biases)"),
            ("model.mlp.n_shared_experts", (0,), " (it has no shared experts)"),
            ("model.mlp.routing.scoring", ("sigmoid",), ""),
            ungrouped(),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        r = cfg.mlp.routing
        return dict(
            self.common_to_hf(cfg),
            intermediate_size=d_ff(cfg),
            moe_intermediate_size=expert_width(cfg),
            num_dense_layers=dense_first(layer_configs(cfg)),
            num_experts=r.n_experts,
            num_experts_per_tok=r.top_k,
            use_expert_bias=r.correction_bias,
            routed_scaling_factor=r.routed_scale,
            norm_topk_prob=r.normalize_top_k,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        routing = dict(
            n_experts=c.num_experts,
            top_k=c.num_experts_per_tok,
            scoring="sigmoid",
            correction_bias=bool(c.use_expert_bias),
            normalize_top_k=bool(c.norm_topk_prob),
            routed_scale=float(c.routed_scaling_factor),
        )
        mlp = mlp_section(
            "moe",
            expert="swiglu",
            bias=False,
            d_ff=c.intermediate_size,
            expert_d_ff=c.moe_intermediate_size,
            routing=routing,
        )
        cfg = self.common_from_hf(c, mlp)
        if c.layer_types is None:
            refuse_hf(
                c, "layer_types", f"a list of '{CONV_T}' and '{FULL_T}' (transformers builds no model without one)"
            )
        cfg.layers = lfm_layers(c, min(c.num_dense_layers, c.num_hidden_layers))
        return cfg

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Each MoE layer's experts, saved apart as ``w1``, ``w3``, ``w2``, stacked as transformers holds them."""
        state = {k.replace(".feed_forward.experts.", ".mlp.experts."): v for k, v in state.items()}
        state = stack_saved_experts(cfg, state, ("w1", "w3", "w2"))
        return {k.replace(".mlp.experts.", ".feed_forward.experts."): v for k, v in state.items()}


RECORDS: tuple[Family, ...] = (Lfm2(), Lfm2Moe())
