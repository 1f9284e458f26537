"""Qwen3-MoE (``Qwen3MoeForCausalLM``): Qwen3's attention (per-head QK-norm) over softmax-routed experts (the shared MoE parts in ``moe``)."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    ModelConfig,
)
from archlab.config.layers import layer_configs
from archlab.interop.families.base import LAYERS, ONE_BIAS_FLAG, Family, Rule, out_bias
from archlab.interop.families.experts import dense_first, with_dense_first
from archlab.interop.families.softmax_moe import _Softmax
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width


class Qwen3Moe(_Softmax):
    """Qwen3MoeForCausalLM: Qwen3's attention (per-head QK-norm, explicit head_dim, one attention_bias
    flag) and MoE layers of ``moe_intermediate_size`` experts, the top-k weights renormalised as
    ``norm_topk_prob`` says; ``mlp_only_layers`` 0 .. N-1 are archlab's first N layers of a dense kind
    (width ``intermediate_size``, ``with_dense_first``)."""

    parts = "Qwen3's layers with a softmax top-k MoE, dense layers by a kind"

    model_type, title, model_class, config_class = "qwen3_moe", "Qwen3-MoE", "Qwen3MoeForCausalLM", "Qwen3MoeConfig"
    features = _Softmax.features | {"model.attention.qk_norm"} | LAYERS

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            ("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)"),
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        m, window = cfg.mlp, cfg.attention.window
        return dict(
            super().to_hf(cfg),
            head_dim=head_dim(cfg),
            attention_bias=cfg.attention.qkv_bias,
            use_sliding_window=window is not None,
            num_experts=m.routing.n_experts,
            moe_intermediate_size=expert_width(cfg),
            intermediate_size=d_ff(cfg),
            norm_topk_prob=m.routing.normalize_top_k,
            decoder_sparse_step=1,
            mlp_only_layers=list(range(dense_first(layer_configs(cfg)))),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.decoder_sparse_step != 1:
            refuse_hf(c, "decoder_sparse_step", "1 (archlab's MoE layers are every layer after the dense ones)")
        if c.num_experts < 1:
            refuse_hf(c, "num_experts", "at least 1 (archlab's MoE layers have routed experts)")
        dense = list(c.mlp_only_layers)
        if dense != list(range(len(dense))):
            refuse_hf(c, "mlp_only_layers", "the first N layers, [0, 1, ..., N-1] (archlab's dense layer kinds)")
        mlp = self.moe_from_hf(
            c,
            c.num_experts,
            c.moe_intermediate_size,
            d_ff=c.intermediate_size,
            normalize_top_k=bool(c.norm_topk_prob),
            aux_loss_weight=float(c.router_aux_loss_coef),
        )
        cfg = with_dense_first(self.causal_from_hf(c, mlp), min(len(dense), c.num_hidden_layers))
        bias = bool(c.attention_bias)
        cfg.attention.qkv_bias, cfg.attention.out_bias, cfg.attention.qk_norm = bias, bias, "head"
        return cfg  # Qwen3MoeConfig has already set sliding_window to None unless use_sliding_window


RECORDS: tuple[Family, ...] = (Qwen3Moe(),)
