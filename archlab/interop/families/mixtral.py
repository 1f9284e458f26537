"""Mixtral (``MixtralForCausalLM``): softmax-routed experts under LLaMA's attention (the shared MoE parts in ``moe``)."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    ModelConfig,
)
from archlab.interop.families.base import Family, Rule, out_bias
from archlab.interop.families.softmax_moe import _Softmax
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.base import head_dim
from archlab.nn.moe import expert_width


class Mixtral(_Softmax):
    """MixtralForCausalLM: Mistral's attention (no biases) and a MoE in every layer, softmax over the
    experts, the top-k weights renormalised; ``intermediate_size`` is an expert's width."""

    parts = "Mistral's layers with a softmax top-k MoE of SwiGLU experts"

    model_type, title, model_class, config_class = "mixtral", "Mixtral", "MixtralForCausalLM", "MixtralConfig"
    expert_matrices = ("w1", "w3", "w2")
    checkpoint_renames = {".block_sparse_moe.": ".mlp."}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            ("model.attention.qkv_bias", (False,), ""),
            out_bias(False),
            ("model.mlp.routing.normalize_top_k", (True,), " (it always renormalises the top-k weights)"),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        hd = head_dim(cfg)
        return dict(
            super().to_hf(cfg),
            head_dim=None if hd == cfg.d_model // cfg.attention.n_head else hd,  # as published: null when implied
            num_local_experts=cfg.mlp.routing.n_experts,
            intermediate_size=expert_width(cfg),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.router_jitter_noise:
            refuse_hf(c, "router_jitter_noise", "0.0 (archlab's router has no input jitter)")
        mlp = self.moe_from_hf(
            c,
            c.num_local_experts,
            c.intermediate_size,
            normalize_top_k=True,
            aux_loss_weight=float(c.router_aux_loss_coef),
        )
        return self.causal_from_hf(c, mlp)


RECORDS: tuple[Family, ...] = (Mixtral(),)
