"""MiniMax-M2 (``MiniMaxM2ForCausalLM``): LLaMA's attention without biases, q and k RMSNormed over the whole
projection before RoPE (archlab's ``qk_norm: full``), half-paired partial RoPE, and a MoE in every layer:
sigmoid scores plus a selection-only correction bias (``mlp.e_score_correction_bias``, beside the router
rather than in it), top-k renormalised, no shared experts or groups. Its checkpoints hold the MoE as
Mixtral's (``block_sparse_moe.experts.<e>.w1/w3/w2``), stacked on loading as transformers does."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig, n_kv_head
from archlab.interop.families.base import Family, Rule, out_bias, ungrouped
from archlab.interop.families.experts import mlp_tensors, pre_norm_tensors
from archlab.interop.families.moe import _Sparse
from archlab.interop.families.rope import rope_fraction, rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.moe import expert_width

# Keys of MiniMax's own modeling code (trust_remote_code) that transformers' class fixes: the value it computes.
_FIXED = {
    "scoring_func": "sigmoid",
    "use_routing_bias": True,
    "qk_norm_type": "per_layer",
    "shared_intermediate_size": 0,
}


class MiniMaxM2(_Sparse):
    """MiniMaxM2ForCausalLM: see the module docstring."""

    model_type, title, model_class, config_class = "minimax_m2", "MiniMax-M2", "MiniMaxM2ForCausalLM", "MiniMaxM2Config"
    features = frozenset({"model.position.scaling.kind", "model.attention.qk_norm"})
    parts = "LLaMA's layers (QK-norm over the projection, partial RoPE) with a sigmoid top-k MoE with correction bias"
    expert_matrices = ("w1", "w3", "w2")
    checkpoint_renames = {".block_sparse_moe.": ".mlp."}

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.position.pairing", ("half",), ""),
            ("model.attention.qk_norm", ("full",), " (q_norm and k_norm span the projection)"),
            ("model.attention.qkv_bias", (False,), ""),
            out_bias(False),
            ("model.mlp.routing.scoring", ("sigmoid",), ""),
            ("model.mlp.routing.correction_bias", (True,), " (its router always has e_score_correction_bias)"),
            ("model.mlp.routing.normalize_top_k", (True,), " (it always renormalises the top-k weights)"),
            ungrouped(),
            ("model.mlp.routing.routed_scale", (1.0,), ""),
            ("model.mlp.n_shared_experts", (0,), " (it has no shared experts)"),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        m = cfg.mlp
        return dict(
            self.base_to_hf(cfg),
            num_key_value_heads=n_kv_head(cfg),
            head_dim=head_dim(cfg),
            rope_parameters=rope_to_hf(cfg, rope_fraction(cfg)),
            intermediate_size=expert_width(cfg),
            num_local_experts=m.routing.n_experts,
            num_experts_per_tok=m.routing.top_k,
            router_aux_loss_coef=m.routing.aux_loss_weight,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.router_jitter_noise:
            refuse_hf(c, "router_jitter_noise", "0.0 (archlab's router has no input jitter)")
        for key, computed in _FIXED.items():
            if getattr(c, key, None) not in (None, computed):
                refuse_hf(c, key, f"{computed!r} (what transformers' {self.model_class} computes)")
        attention = AttentionConfig(
            n_kv_head=c.num_key_value_heads or c.num_attention_heads,
            head_dim=c.head_dim,
            qkv_bias=False,
            out_bias=False,
            qk_norm="full",
            dropout=float(c.attention_dropout),
        )
        position = rope_from_hf(c, c.head_dim, partial=True, scalings=self.rope_types())
        mlp = self.moe_from_hf(
            c,
            c.num_local_experts,
            c.intermediate_size,
            scoring="sigmoid",
            correction_bias=True,
            normalize_top_k=True,
            aux_loss_weight=float(c.router_aux_loss_coef),
        )
        return self.base_from_hf(c, position, attention, mlp)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        def attention(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
            t.qkv(f"{archlab}.qkv", hf, False)
            t.add(f"{archlab}.q_norm", f"{hf}.q_norm")
            t.add(f"{archlab}.k_norm", f"{hf}.k_norm")
            t.add(f"{archlab}.proj", f"{hf}.o_proj")

        def mlp(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
            mlp_tensors(t, lc, archlab, hf, router_bias="e_score_correction_bias")

        return pre_norm_tensors(cfg, attention, mlp)


RECORDS: tuple[Family, ...] = (MiniMaxM2(),)
