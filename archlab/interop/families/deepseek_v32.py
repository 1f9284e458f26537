"""DeepSeek sparse attention's families: DeepSeek-V3.2 (``deepseek_v32``) and GLM-5 (``glm_moe_dsa``),
DeepSeek-V3's layout whose latent attention keeps the keys a lightning indexer picks (``dsa``). Their
indexers differ in the pairs they rotate: V3.2's halves beside its mla's interleaved pairs, GLM-5's
interleaved as its mla's (``model.attention.index_pairing``). GLM-5's layers may keep the previous indexer's
choice (``indexer_types`` "shared": dsa's ``index_shared``, by layer kinds). The indexer's loss weight is a
training setting that neither class has: not written."""

from __future__ import annotations

from typing import Any

from archlab.config import LayersConfig, ModelConfig
from archlab.config.layers import layer_configs
from archlab.interop.families.base import Family, Problem, Rule
from archlab.interop.families.deepseek import _DeepSeek, latent_eps_from_hf, mla_tensors
from archlab.interop.families.experts import pre_norm_tensors
from archlab.interop.families.layered import view
from archlab.interop.families.layered_moe import apply_layout
from archlab.interop.families.sigmoid_moe import dense_prefix, mlp_layer_types
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.dsa import DSAConfig

# the indexer's config keys, copied as they are (``Family.keys``)
DSA_KEYS = {
    "index_n_heads": "attention.index_n_heads",
    "index_head_dim": "attention.index_head_dim",
    "index_topk": "attention.index_topk",
}


SHARED = {"attention": {"index_shared": True}}
INDEX_SHARED = ".attention.index_shared"


def dsa_layers(cfg: ModelConfig, dense_layers: list[bool], indexers: list[str], dense: dict[str, Any]) -> ModelConfig:
    """``cfg`` with each layer's kind by its MLP (``dense_layers[i]``: the fields ``dense``, else the model's
    MoE) and its indexer (``indexers[i]``: "full", or "shared", dsa's ``index_shared``): kinds full, shared,
    dense, dense_shared (one for every layer: merged into the model's parts)."""
    cfg.layers = LayersConfig()
    names = [("dense" if d else "full") + ("_shared" if t == "shared" else "") for d, t in zip(dense_layers, indexers)]
    names = ["shared" if n == "full_shared" else n for n in names]
    overrides = {"full": {}, "shared": SHARED, "dense": dense, "dense_shared": {**dense, **SHARED}}
    return apply_layout(cfg, names, overrides)


def indexer_types(cfg: ModelConfig) -> list[str]:
    """transformers' ``indexer_types``: "shared" where a layer is dsa's ``index_shared``, else "full"."""
    return ["shared" if lc.attention.index_shared else "full" for lc in layer_configs(cfg)]


def layer_attention(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """A layer's latent attention and its indexer, where it has one (not ``index_shared``)."""
    (mla_tensors if lc.attention.index_shared else dsa_tensors)(t, archlab, hf)


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
    shares_indexers = False  # whether its layers may keep the previous indexer's choice (indexer_types)

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        pairs = ("interleaved", "model") if self.index_pairing == "interleaved" else (self.index_pairing,)
        return super().family_rules(cfg) + [
            ("model.position.pairing", ("interleaved",), " (its mla rotates interleaved pairs)"),
            ("model.attention.index_pairing", pairs, f" (its indexer rotates {self.index_pairing} pairs)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        found = super().part_problems(cfg)
        if self.shares_indexers:  # a layer kind's index_shared is the family's too (dense_first_problems' otherwise)
            found = [p for p in found if not p.field.endswith(INDEX_SHARED)]
        elif cfg.attention.index_shared:
            why = " (each of its layers runs its own indexer)"
            found.append(Problem("model.attention.index_shared", True, "false", why, (False,)))
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

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return pre_norm_tensors(cfg, layer_attention)


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
    """GlmMoeDsaForCausalLM (GLM-5): DeepSeek-V3.2's layout, its indexer rotating interleaved pairs; a layer
    may keep the last earlier indexer's choice (``indexer_types`` "shared": dsa's ``index_shared``)."""

    model_type, title, model_class, config_class = (
        "glm_moe_dsa",
        "GLM-5 (MoE, DSA)",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaConfig",
    )
    parts = "DeepSeek-V3.2's parts, the indexer's pairs interleaved, its choice shared by later layers"
    index_pairing = "interleaved"
    shares_indexers = True

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), indexer_types=indexer_types(cfg))

    def from_hf(self, c: Any) -> ModelConfig:
        types = list(c.indexer_types)
        if (
            len(types) != c.num_hidden_layers
            or any(t not in ("full", "shared") for t in types)
            or types[:1] == ["shared"]
        ):
            refuse_hf(c, "indexer_types", "one 'full' or 'shared' per layer, the first 'full' (a shared one reuses it)")
        cfg = super().from_hf(c)
        if "shared" not in types:
            return cfg
        dense_layers = [lc.mlp.kind != "moe" for lc in layer_configs(cfg)]
        return dsa_layers(cfg, dense_layers, types, cfg.layers.kinds.get("dense", {}))


RECORDS: tuple[Family, ...] = (DeepseekV32(), GlmMoeDsa())
