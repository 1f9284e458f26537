"""DeepSeek sparse attention's families: DeepSeek-V3.2 (``deepseek_v32``) and GLM-5 (``glm_moe_dsa``),
DeepSeek-V3's layout whose latent attention keeps the keys a lightning indexer picks (``dsa``). Their
indexers differ in the pairs they rotate: V3.2's halves beside its mla's interleaved pairs, GLM-5's
interleaved as its mla's (``model.attention.index_pairing``). The indexer's loss weight is a training
setting that neither class has: not written."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Problem, Rule
from archlab.interop.families.deepseek import _DeepSeek, latent_eps_from_hf, mla_tensors
from archlab.interop.families.layered import view
from archlab.interop.families.sigmoid_moe import dense_prefix, mlp_layer_types
from archlab.interop.families.tensors import Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.dsa import DSAConfig

# the indexer's config keys, copied as they are (``Family.keys``)
DSA_KEYS = {
    "index_n_heads": "attention.index_n_heads",
    "index_head_dim": "attention.index_head_dim",
    "index_topk": "attention.index_topk",
}


def dsa_tensors(t: Tensors, archlab: str, hf: str) -> None:
    """DeepSeek's latent attention (``mla_tensors``) and its indexer: wq_b from the query latent, wk and its
    LayerNorm k_norm, weights_proj."""
    mla_tensors(t, archlab, hf)
    t.add(f"{archlab}.indexer.q_up", f"{hf}.indexer.wq_b")
    t.add(f"{archlab}.indexer.k_proj", f"{hf}.indexer.wk")
    t.add(f"{archlab}.indexer.k_norm", f"{hf}.indexer.k_norm", bias=True)
    t.add(f"{archlab}.indexer.head_weights", f"{hf}.indexer.weights_proj")


class _SparseAttention(_DeepSeek):
    """DeepSeek-V3's layout with dsa in every layer (V3's routing, shared experts, dense first layers by
    ``mlp_layer_types``): mla's rotated pairs always interleaved (the config has no ``rope_interleave``),
    queries always through ``q_lora_rank`` (the indexer reads that latent), the indexer's pairs the
    record's ``index_pairing``."""

    attention_kind = "dsa"
    keys = {**_DeepSeek.keys, **DSA_KEYS}
    index_pairing = "half"

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        pairs = ("interleaved", "model") if self.index_pairing == "interleaved" else (self.index_pairing,)
        return super().family_rules(cfg) + [
            ("model.position.pairing", ("interleaved",), " (its mla rotates interleaved pairs)"),
            ("model.attention.index_pairing", pairs, f" (its indexer rotates {self.index_pairing} pairs)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        found = super().part_problems(cfg)
        if cfg.attention.q_lora_rank is None:
            why = " (its queries and its indexer's always pass the query latent)"
            found.append(Problem("model.attention.q_lora_rank", None, "a positive integer", why))
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(self.mla_to_hf(cfg), mlp_layer_types=mlp_layer_types(cfg))  # what the modeling code reads

    def from_hf(self, c: Any) -> ModelConfig:
        if c.q_lora_rank is None:
            refuse_hf(c, "q_lora_rank", "a positive integer (archlab's dsa: the indexer reads the query latent)")
        return self.deepseek_from_hf(
            view(c, first_k_dense_replace=dense_prefix(c)),
            "interleaved",
            **self.v3_routing(c),
        )

    def attention_from_hf(self, c: Any) -> DSAConfig:
        return DSAConfig(
            dropout=float(c.attention_dropout),
            latent_norm_eps=latent_eps_from_hf(c),
            index_pairing=self.index_pairing,
        )

    def attention_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        dsa_tensors(t, archlab, hf)


class DeepseekV32(_SparseAttention):
    """DeepseekV32ForCausalLM (DeepSeek-V3.2-Exp): its indexer rotates halves of its first
    ``qk_rope_head_dim`` dims while its mla rotates interleaved pairs."""

    model_type, title, model_class, config_class = (
        "deepseek_v32",
        "DeepSeek-V3.2",
        "DeepseekV32ForCausalLM",
        "DeepseekV32Config",
    )
    parts = "DeepSeek-V3's parts with DeepSeek sparse attention (dsa: a lightning indexer's top-k keys per query)"


class GlmMoeDsa(_SparseAttention):
    """GlmMoeDsaForCausalLM (GLM-5): DeepSeek-V3.2's layout, its indexer rotating interleaved pairs. A layer
    that reuses the previous layer's choice (``indexer_types`` "shared") is refused: each dsa layer runs its
    own indexer."""

    model_type, title, model_class, config_class = (
        "glm_moe_dsa",
        "GLM-5 (MoE, DSA)",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaConfig",
    )
    parts = "DeepSeek-V3.2's parts, the indexer's pairs interleaved"
    index_pairing = "interleaved"

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), indexer_types=["full"] * cfg.n_layer)

    def from_hf(self, c: Any) -> ModelConfig:
        if any(t != "full" for t in c.indexer_types):
            refuse_hf(
                c,
                "indexer_types",
                "'full' in every layer (each archlab dsa layer runs its own indexer; none reuses another's keys)",
            )
        return super().from_hf(c)


RECORDS: tuple[Family, ...] = (DeepseekV32(), GlmMoeDsa())
