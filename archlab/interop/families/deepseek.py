"""DeepSeek-V2 and DeepSeek-V3: multi-head latent attention over DeepSeekMoE (shared experts, expert groups, dense first layers; the shared MoE parts in ``moe``)."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    ModelConfig,
)
from archlab.interop.families.base import LAYERS, Family, Rule, ungrouped
from archlab.interop.families.experts import grouped_moe_to_hf, with_dense_first
from archlab.interop.families.moe import _Sparse
from archlab.interop.families.mtp import MTP_FEATURES, MTP_RULE
from archlab.interop.families.rope import rope_from_hf
from archlab.interop.families.tensors import Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.mla import MLAConfig

# The latent norms of transformers' DeepSeek attention keep the RMSNorm default eps, whatever rms_norm_eps says.
DEEPSEEK_LATENT_EPS = 1e-6
LATENT_EPS = "model.attention.latent_norm_eps"


def latent_eps_rule(cfg: ModelConfig) -> Rule:
    """The rule of a family whose latent norms are at 1e-6 whatever its ``rms_norm_eps``: latent_norm_eps
    null beside model.norm.eps 1e-6, else 1e-6 (one spelling of each model, as ``latent_eps_from_hf`` reads)."""
    allowed = (None,) if cfg.norm.eps == DEEPSEEK_LATENT_EPS else (DEEPSEEK_LATENT_EPS,)
    return (LATENT_EPS, allowed, " (its latent norms always use 1e-6: null where model.norm.eps is 1e-6)")


def latent_eps_from_hf(c: Any) -> float | None:
    """model.attention.latent_norm_eps of such a family's config: null where rms_norm_eps is 1e-6 already."""
    return None if c.rms_norm_eps == DEEPSEEK_LATENT_EPS else DEEPSEEK_LATENT_EPS


# Multi-head latent attention's config keys, copied as they are (``Family.keys``).
MLA_KEYS = {
    "q_lora_rank": "attention.q_lora_rank",
    "kv_lora_rank": "attention.kv_lora_rank",
    "qk_nope_head_dim": "attention.qk_nope_head_dim",
    "qk_rope_head_dim": "attention.qk_rope_head_dim",
    "v_head_dim": "attention.v_head_dim",
}


def mla_tensors(t: Tensors, archlab: str, hf: str) -> None:
    """DeepSeek's latent attention: q_proj (or q_a_proj, its norm and q_b_proj), the kv latent, its norm and
    its up projection, o_proj."""
    if t.cfg.attention.q_lora_rank is None:
        t.add(f"{archlab}.q_proj", f"{hf}.q_proj")
    else:
        t.add(f"{archlab}.q_down", f"{hf}.q_a_proj")
        t.add(f"{archlab}.q_norm", f"{hf}.q_a_layernorm")
        t.add(f"{archlab}.q_up", f"{hf}.q_b_proj")
    t.add(f"{archlab}.kv_down", f"{hf}.kv_a_proj_with_mqa")
    t.add(f"{archlab}.kv_norm", f"{hf}.kv_a_layernorm")
    t.add(f"{archlab}.kv_up", f"{hf}.kv_b_proj")
    t.add(f"{archlab}.proj", f"{hf}.o_proj")


class _DeepSeek(_Sparse):
    """DeepSeek-V3's layout, which its relatives (``mla``: GLM-4.7-Flash, Sarvam MLA) share and DeepSeek-V2
    changes: multi-head latent attention (queries direct or through ``q_lora_rank``, keys and values from a
    ``kv_lora_rank`` latent, one rotated key all heads share), YaRN RoPE, the first ``first_k_dense_replace``
    layers dense (width ``intermediate_size``), then routed experts of ``moe_intermediate_size`` beside
    ``n_shared_experts`` shared ones, weights times ``routed_scaling_factor``; V3's routing: sigmoid scores
    plus the selection-only ``e_score_correction_bias`` (a buffer), group-limited top-k (``n_group``,
    ``topk_group``: groups ranked by their two best scores), renormalised as ``norm_topk_prob`` says;
    rotated pairs interleaved or halves (``rope_interleave``)."""

    attention_kind = "mla"
    position_why = " (it always rotates qk_rope_head_dim dims)"
    features = frozenset({"model.position.scaling.kind", "model.position.scaling.truncate", LATENT_EPS}) | LAYERS
    scalings = ("none", "yarn")
    shared_experts = True
    keys = {**_Sparse.keys, **MLA_KEYS}
    topk_method = "noaux_tc"  # the value of DeepSeek's own config key topk_method this version computes

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [latent_eps_rule(cfg)]

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.mlp.routing.scoring", ("sigmoid",), ""),
            ("model.mlp.routing.correction_bias", (True,), " (its router always has e_score_correction_bias)"),
        ]

    def mla_to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        """The keys V2 and V3 name alike."""
        return dict(
            self.base_to_hf(cfg),
            num_key_value_heads=cfg.attention.n_head,
            attention_bias=False,
            **grouped_moe_to_hf(cfg),
            # read by DeepSeek's own modeling code (trust_remote_code) and by from_hf; transformers fixes them
            scoring_func=cfg.mlp.routing.scoring,
            topk_method=self.topk_method,
        )

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        interleaved = cfg.position.pairing == "interleaved"
        return dict(self.mla_to_hf(cfg), rope_interleave=interleaved, num_mtp_layers=cfg.head.mtp.depth)

    def from_hf(self, c: Any) -> ModelConfig:
        return self.deepseek_from_hf(
            c,
            "interleaved" if c.rope_interleave else "half",
            **self.v3_routing(c),
        )

    def deepseek_from_hf(self, c: Any, pairing: str, **routing: Any) -> ModelConfig:
        """archlab's config, ``routing`` the family's MLPConfig fields (scoring, groups, renormalisation)."""
        if c.attention_bias:
            refuse_hf(c, "attention_bias", "false (archlab's mla projections have no biases)")
        if c.num_key_value_heads not in (None, c.num_attention_heads):
            refuse_hf(
                c, "num_key_value_heads", f"num_attention_heads={c.num_attention_heads} (every head reads the latent)"
            )
        if not c.n_shared_experts:
            refuse_hf(
                c, "n_shared_experts", "at least 1 (archlab's shared experts are one MLP of n·moe_intermediate_size)"
            )
        for key, computed in (("topk_method", self.topk_method), ("scoring_func", routing["scoring"])):
            if getattr(c, key, None) not in (None, computed):  # DeepSeek's own keys: transformers fixes both
                refuse_hf(c, key, f"'{computed}' (what transformers' {self.model_class} computes)")
        position = rope_from_hf(c, c.qk_rope_head_dim, partial=False, scalings=self.rope_types())
        position.pairing = pairing
        mlp = self.moe_from_hf(
            c,
            c.n_routed_experts,
            c.moe_intermediate_size,
            d_ff=c.intermediate_size,
            n_shared_experts=c.n_shared_experts,
            routed_scale=float(c.routed_scaling_factor),
            **routing,
        )
        cfg = self.base_from_hf(c, position, self.attention_from_hf(c), mlp)
        return with_dense_first(cfg, min(c.first_k_dense_replace or 0, c.num_hidden_layers))

    def attention_from_hf(self, c: Any) -> MLAConfig:
        """``model.attention`` of the config: mla (a sparse-attention record's: dsa, mla's fields and more)."""
        return MLAConfig(dropout=float(c.attention_dropout), latent_norm_eps=latent_eps_from_hf(c))

    def attention_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        mla_tensors(t, archlab, hf)


class DeepseekV2(_DeepSeek):
    """DeepseekV2ForCausalLM: softmax scores, greedy top-k (transformers never renormalises the top-k
    weights here, whatever norm_topk_prob says), rotated pairs interleaved."""

    parts = "MLA, DeepSeekMoE (shared experts, groups), dense first layers, YaRN (DeepSeek's reading)"

    model_type, title, model_class, config_class = (
        "deepseek_v2",
        "DeepSeek-V2",
        "DeepseekV2ForCausalLM",
        "DeepseekV2Config",
    )
    topk_method = "greedy"

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.position.pairing", ("interleaved",), " (it rotates interleaved pairs)"),
            ("model.mlp.routing.scoring", ("softmax",), ""),
            ("model.mlp.routing.correction_bias", (False,), ""),
            ungrouped(" (its group_limited_greedy ranks groups by their best score alone)"),
            ("model.mlp.routing.normalize_top_k", (False,), " (it never renormalises the top-k weights)"),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(self.mla_to_hf(cfg), mlp_bias=False)

    def from_hf(self, c: Any) -> ModelConfig:
        if c.mlp_bias:
            refuse_hf(c, "mlp_bias", "false (archlab's experts have no biases)")
        if c.norm_topk_prob:
            refuse_hf(c, "norm_topk_prob", "false (transformers' DeepseekV2 never renormalises the top-k weights)")
        if c.topk_method != "greedy":
            refuse_hf(
                c,
                "topk_method",
                "'greedy' (group_limited_greedy ranks groups by their best score; archlab by their two best, as V3)",
            )
        return self.deepseek_from_hf(c, "interleaved", scoring="softmax", normalize_top_k=False)


class DeepseekV3(_DeepSeek):
    """DeepseekV3ForCausalLM: ``_DeepSeek``'s layout; its checkpoints' multi-token prediction modules
    (``num_mtp_layers``, layers past the last), which the class leaves out, read and written beside it
    (``families/mtp.py``)."""

    features = _DeepSeek.features | MTP_FEATURES
    mtp_keys = ("num_mtp_layers",)

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [MTP_RULE]

    parts = "DeepSeek-V2's parts with sigmoid routing and a correction bias"

    model_type, title, model_class, config_class = (
        "deepseek_v3",
        "DeepSeek-V3",
        "DeepseekV3ForCausalLM",
        "DeepseekV3Config",
    )


RECORDS: tuple[Family, ...] = (
    DeepseekV2(),
    DeepseekV3(),
)
