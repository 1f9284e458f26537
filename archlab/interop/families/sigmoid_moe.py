"""Sigmoid-routed mixtures of experts with LLaMA-style attention: Solar Open (GLM-4.5's MoE in every layer
under LLaMA's attention), Sarvam MoE (GLM-4.5's own class under another ``model_type``) and Hunyuan V3
(Qwen3's attention over sigmoid top-k routing with a correction bias beside the router, shared experts and
dense first layers by ``mlp_layer_types``). Each is a ``base.Family`` record reusing ``moe``'s and ``dots``'s
parts; layouts that an earlier table's record already holds (dots.llm1's, GLM-4.5's) export there."""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from archlab.config import ModelConfig, n_kv_head
from archlab.config.layers import layer_configs
from archlab.interop.families.base import LAYERS, ONE_BIAS_FLAG, Family, Problem, Rule, out_bias, ungrouped
from archlab.interop.families.dots import SigmoidRouted
from archlab.interop.families.experts import dense_first, mlp_tensors, pre_norm_tensors, with_dense_first
from archlab.interop.families.glm4_moe import Glm4Moe, glm_attention_rules, glm_from_hf, glm_to_hf, without_mtp
from archlab.interop.families.layered import view
from archlab.interop.families.moe import _Sparse
from archlab.interop.families.mtp import MTP_RULE
from archlab.interop.families.rope import rope_from_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width


def dense_prefix(c: Any, key: str = "mlp_layer_types") -> int:
    """How many first layers the config's per-layer MLP list ``key`` ("dense" / "sparse") makes dense,
    refusing a list whose dense layers are not the first ones (archlab's dense layer kinds)."""
    types = list(getattr(c, key))
    n = next((i for i, t in enumerate(types) if t != "dense"), len(types))
    if len(types) != c.num_hidden_layers or any(t not in ("dense", "sparse") for t in types) or "dense" in types[n:]:
        refuse_hf(c, key, "one 'dense' or 'sparse' per layer, the dense ones first (archlab's dense layer kinds)")
    return n


def mlp_layer_types(cfg: ModelConfig) -> list[str]:
    """transformers' ``mlp_layer_types`` of a MoE layout whose first layers may be dense."""
    n = dense_first(layer_configs(cfg))
    return ["dense"] * n + ["sparse"] * (cfg.n_layer - n)


class SolarOpen(SigmoidRouted):
    """SolarOpenForCausalLM: LLaMA's attention (q/k/v biases by ``attention_bias``, none on o_proj, full
    RoPE) over GLM-4.5's MoE (sigmoid scores, correction bias, groups, shared experts) in every layer."""

    model_type, title, model_class, config_class = "solar_open", "Solar Open", "SolarOpenForCausalLM", "SolarOpenConfig"
    features = frozenset({"model.position.scaling.kind"})
    parts = "LLaMA's layers (q/k/v biases) over a sigmoid top-k MoE with correction bias, groups, shared experts in every layer"

    def attention_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [out_bias(False, " (o_proj has no bias)")]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return super().part_problems(cfg) + self.full_rotary(cfg)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        for key in ("intermediate_size", "first_k_dense_replace"):  # SolarOpenConfig has neither: no dense layers
            del kwargs[key]
        return kwargs

    def from_hf(self, c: Any) -> ModelConfig:
        return self.routed_from_hf(
            view(c, intermediate_size=None, first_k_dense_replace=0), qk_norm="none", out_bias=False
        )


# Sarvam MoE's checkpoint names (its original code's, which transformers saves) -> Glm4MoeForCausalLM's
_SARVAM_NAMES = (
    (r"^model\.word_embeddings\.", "model.embed_tokens."),
    (r"\.attention\.", ".self_attn."),
    (r"\.self_attn\.dense\.", ".self_attn.o_proj."),
    (r"\.self_attn\.query_layernorm\.", ".self_attn.q_norm."),
    (r"\.self_attn\.key_layernorm\.", ".self_attn.k_norm."),
    (r"\.mlp\.gate\.expert_bias$", ".mlp.gate.e_score_correction_bias"),
)


class SarvamMoe(SigmoidRouted):
    """Sarvam MoE (``sarvam_moe``): GLM-4.5's own class, Glm4MoeForCausalLM, its config (full RoPE and
    QK-norm by default) under another name (GLM-4.5's rules, keys and reading: ``glm4_moe``). Its checkpoints
    keep the original code's names, the q/k/v rows fused (``query_key_value``): renamed and split on loading,
    as transformers does; the MTP layers (``num_mtp_layers``) read and written as GLM-4.5's."""

    model_type, title, model_class, config_class = "sarvam_moe", "Sarvam MoE", "Glm4MoeForCausalLM", "SarvamMoEConfig"
    features = Glm4Moe.features
    mtp_keys = Glm4Moe.mtp_keys
    partial = True
    parts = "GLM-4.5's parts (its class Glm4MoeForCausalLM)"

    def attention_rules(self, cfg: ModelConfig) -> list[Rule]:
        return glm_attention_rules()

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [MTP_RULE]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return glm_to_hf(super().to_hf(cfg), cfg)

    def from_hf(self, c: Any) -> ModelConfig:
        return glm_from_hf(self, c)

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        for old, new in _SARVAM_NAMES:
            state = {re.sub(old, new, k): v for k, v in state.items()}
        sizes = [n * head_dim(cfg) for n in (cfg.attention.n_head, n_kv_head(cfg), n_kv_head(cfg))]
        for name in [k for k in state if ".self_attn.query_key_value." in k]:
            parts = state.pop(name).split(sizes)
            for x, part in zip("qkv", parts):
                state[name.replace("query_key_value", f"{x}_proj")] = part
        return super().from_checkpoint(cfg, without_mtp(cfg, state))


class HYV3(_Sparse):
    """HYV3ForCausalLM (Hunyuan V3): Qwen3's attention (per-head QK-norm before RoPE, one ``attention_bias``
    flag for q/k/v and o) over sigmoid scores plus the selection-only ``e_score_correction_bias`` (beside
    the router, as MiniMax-M2's), the top-k always renormalised, times ``router_scaling_factor``, beside
    ``num_shared_experts`` shared experts; the layers ``mlp_layer_types`` marks dense come first."""

    model_type, title, model_class, config_class = "hy_v3", "Hunyuan V3", "HYV3ForCausalLM", "HYV3Config"
    features = frozenset({"model.position.scaling.kind", "model.attention.qk_norm"}) | LAYERS
    shared_experts = True
    parts = "Qwen3's layers over a sigmoid top-k MoE with correction bias and shared experts, dense first layers"
    checkpoint_renames = {  # its checkpoints' names (each expert saved apart, stacked by _Sparse)
        ".mlp.router.gate.weight": ".mlp.gate.weight",
        ".mlp.expert_bias": ".mlp.e_score_correction_bias",
        ".mlp.shared_mlp.": ".mlp.shared_experts.",
    }

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.position.pairing", ("half",), ""),
            ("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)"),
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
            ("model.mlp.routing.scoring", ("sigmoid",), ""),
            ("model.mlp.routing.correction_bias", (True,), " (its MoE always has e_score_correction_bias)"),
            ("model.mlp.routing.normalize_top_k", (True,), " (it always renormalises the top-k weights)"),
            ungrouped(),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return super().part_problems(cfg) + self.full_rotary(cfg)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        m = cfg.mlp
        return dict(
            self.base_to_hf(cfg),
            num_key_value_heads=n_kv_head(cfg),
            head_dim=head_dim(cfg),
            attention_bias=cfg.attention.qkv_bias,
            mlp_bias=False,
            intermediate_size=d_ff(cfg),
            moe_intermediate_size=expert_width(cfg),
            num_experts=m.routing.n_experts,
            num_experts_per_tok=m.routing.top_k,
            num_shared_experts=m.n_shared_experts,
            router_scaling_factor=m.routing.routed_scale,
            mlp_layer_types=mlp_layer_types(cfg),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.mlp_bias:
            refuse_hf(c, "mlp_bias", "false (archlab's experts have no biases)")
        if not c.num_experts:
            refuse_hf(c, "num_experts", "at least 1 (archlab's MoE layers have routed experts)")
        if not c.num_shared_experts:  # 0 builds shared experts of intermediate_size
            refuse_hf(
                c, "num_shared_experts", "at least 1 (archlab's shared experts are one MLP of n·moe_intermediate_size)"
            )
        n_dense = dense_prefix(c)
        bias = bool(c.attention_bias)
        attention = AttentionConfig(
            n_kv_head=c.num_key_value_heads or c.num_attention_heads,
            head_dim=c.head_dim,
            qkv_bias=bias,
            out_bias=bias,
            qk_norm="head",
            dropout=float(c.attention_dropout),
        )
        position = rope_from_hf(c, c.head_dim, partial=False, scalings=self.rope_types())
        mlp = self.moe_from_hf(
            c,
            c.num_experts,
            c.moe_intermediate_size,
            d_ff=c.intermediate_size,
            n_shared_experts=c.num_shared_experts,
            routed_scale=float(c.router_scaling_factor),
            scoring="sigmoid",
            correction_bias=True,
            normalize_top_k=True,
        )
        return with_dense_first(self.base_from_hf(c, position, attention, mlp), n_dense)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        def attention(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
            bias = t.cfg.attention.qkv_bias
            t.qkv(f"{archlab}.qkv", hf, bias)
            t.add(f"{archlab}.q_norm", f"{hf}.q_norm")
            t.add(f"{archlab}.k_norm", f"{hf}.k_norm")
            t.add(f"{archlab}.proj", f"{hf}.o_proj", bias)

        def mlp(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
            mlp_tensors(t, lc, archlab, hf, router_bias="e_score_correction_bias")

        return pre_norm_tensors(cfg, attention, mlp)


RECORDS: tuple[Family, ...] = (SolarOpen(), SarvamMoe(), HYV3())
