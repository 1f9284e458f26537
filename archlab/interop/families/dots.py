"""dots.llm1 (``Dots1ForCausalLM``) and what it shares with GLM-4.5 (``glm4_moe``): LLaMA's attention
(separate q/k/v, GQA) over DeepSeek-V3's routing, sigmoid scores plus the selection-only
``e_score_correction_bias``, group-limited top-k, renormalised as ``norm_topk_prob`` says, times
``routed_scaling_factor``, beside ``n_shared_experts`` shared experts; the first ``first_k_dense_replace``
layers dense (width ``intermediate_size``, ``moe.with_dense_first``)."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig, PositionConfig, n_kv_head
from archlab.interop.families.base import LAYERS, ONE_BIAS_FLAG, Family, Problem, Rule, out_bias
from archlab.interop.families.experts import grouped_moe_to_hf, with_dense_first
from archlab.interop.families.moe import _Sparse
from archlab.interop.families.rope import rope_from_hf
from archlab.interop.families.tensors import Tensors
from archlab.interop.families.values import config_head_dim, refuse_hf
from archlab.interop.families.windows import layer_types, uniform_window
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim


class SigmoidRouted(_Sparse):
    """LLaMA-style attention over DeepSeek-V3's routing with shared experts and dense first layers: the
    config keys dots.llm1 and GLM-4.5 name alike. Each sets its attention's biases, QK-norm and RoPE."""

    shared_experts = True
    partial = False  # whether the family rotates part of a head (partial_rotary_factor)

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.routing.scoring", ("sigmoid",), ""),
            ("model.mlp.routing.correction_bias", (True,), " (its router always has e_score_correction_bias)"),
            *self.attention_rules(cfg),
        ]

    def attention_rules(self, cfg: ModelConfig) -> list[Rule]:
        """What the family requires of the attention's biases and QK-norm."""
        return []

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            self.base_to_hf(cfg),
            num_key_value_heads=n_kv_head(cfg),
            head_dim=head_dim(cfg),
            attention_bias=cfg.attention.qkv_bias,
            **grouped_moe_to_hf(cfg),
        )

    def routed_from_hf(self, c: Any, qk_norm: str, out_bias: bool) -> ModelConfig:
        """archlab's config, the attention's QK-norm and output bias as the family reads them."""
        if not c.n_shared_experts:
            refuse_hf(
                c, "n_shared_experts", "at least 1 (archlab's shared experts are one MLP of n·moe_intermediate_size)"
            )
        if not c.n_routed_experts:
            refuse_hf(c, "n_routed_experts", "at least 1 (archlab's MoE layers have routed experts)")
        hd = config_head_dim(c)
        attention = AttentionConfig(
            n_kv_head=c.num_key_value_heads or c.num_attention_heads,
            head_dim=hd,
            qkv_bias=bool(c.attention_bias),
            out_bias=out_bias,
            qk_norm=qk_norm,
            dropout=float(c.attention_dropout),
        )
        position: PositionConfig = rope_from_hf(c, hd, partial=self.partial, scalings=self.rope_types())
        mlp = self.moe_from_hf(
            c,
            c.n_routed_experts,
            c.moe_intermediate_size,
            d_ff=c.intermediate_size,
            n_shared_experts=c.n_shared_experts,
            routed_scale=float(c.routed_scaling_factor),
            **self.v3_routing(c),
        )
        cfg = self.base_from_hf(c, position, attention, mlp)
        return with_dense_first(cfg, min(c.first_k_dense_replace or 0, c.num_hidden_layers))

    def attention_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        a = t.cfg.attention
        t.qkv(f"{archlab}.qkv", hf, a.qkv_bias)
        if a.qk_norm != "none":
            t.add(f"{archlab}.q_norm", f"{hf}.q_norm")
            t.add(f"{archlab}.k_norm", f"{hf}.k_norm")
        t.add(f"{archlab}.proj", f"{hf}.o_proj", a.out_bias)


class Dots1(SigmoidRouted):
    """Dots1ForCausalLM (dots.llm1): Qwen3's attention (per-head QK-norm before RoPE, one
    ``attention_bias`` flag for q/k/v and output, full RoPE, a sliding window on every layer or none) over
    DeepSeek-V3's routing with shared experts and dense first layers."""

    model_type, title, model_class, config_class = "dots1", "dots.llm1", "Dots1ForCausalLM", "Dots1Config"
    features = frozenset({"model.position.scaling.kind", "model.attention.qk_norm", "model.attention.window"}) | LAYERS
    parts = "Qwen3's layers (a sliding window or none) over a sigmoid top-k MoE with correction bias, groups, shared experts, dense first layers"

    def attention_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)"),
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return super().part_problems(cfg) + self.full_rotary(cfg)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        window = cfg.attention.window
        return dict(
            super().to_hf(cfg),
            sliding_window=window,
            max_window_layers=0 if window is not None else cfg.n_layer,
            layer_types=layer_types([cfg] * cfg.n_layer),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = self.routed_from_hf(c, qk_norm="head", out_bias=bool(c.attention_bias))
        cfg.attention.window = uniform_window(c)
        return cfg


RECORDS: tuple[Family, ...] = (Dots1(),)
