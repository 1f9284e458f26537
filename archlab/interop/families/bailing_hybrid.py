"""Bailing (Ling) hybrid (``BailingHybridForCausalLM``, Ling 3): Kimi-Linear's layout (pre-norm RMSNorm
layers of Kimi Delta Attention or multi-head latent attention as ``layer_types`` says, DeepSeek-V3's MoE or a
dense SwiGLU as ``mlp_layer_types`` says) with three changes, each an archlab field:

- its latent attention rotates the ``qk_rope_head_dim`` part by RoPE in interleaved pairs (``rope_parameters``,
  DeepSeek's YaRN reading) and gates each head's output by sigmoid(``g_proj``(x)): ``mla`` with ``gate: head``;
- its KDA layers project the decay's input and the output gate at full size (``f_proj``, ``g_proj``):
  ``gate_rank: 0``; ``kda_safe_gate`` is the bounded decay above ``kda_lower_bound`` (``decay: bounded``,
  ``decay_lower_bound``), else Kimi's softplus; heads as many and as wide as ``num_attention_heads`` and
  ``head_dim`` say (transformers reads its linear sizes from those);
- layouts come as ``layer_group_size`` (every group's last layer MLA) and ``first_k_dense_replace`` where
  ``layer_types`` and ``mlp_layer_types`` are unset; both lists are written out.

Its multi-token-prediction layers (``num_mtp_layers``, stored after the decoder as ``model.layers.<n_layer+i>``),
which transformers' causal LM drops, are read and written beside it as DeepSeek-V3's (``families/mtp.py``), each
an MLA MoE layer, the model's own parts; transformers' ``MtpModel`` builds them only from a config that names
their types (``mtp_layer_types``, ``mtp_mlp_layer_types``), which archlab writes."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import ModelConfig, PositionConfig
from archlab.config.layers import layer_configs
from archlab.interop.families.base import LAYERS, Problem, Rule
from archlab.interop.families.deepseek import LATENT_EPS, mla_tensors
from archlab.interop.families.experts import is_dense, pre_norm_tensors
from archlab.interop.families.glm4_moe import without_mtp
from archlab.interop.families.kimi_linear import FULL, LINEAR, KimiLinear, is_kda
from archlab.interop.families.mtp import MTP_FEATURES, MTP_RULE
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.mla import MLAConfig

GATE, SCALING = "model.attention.gate", "model.position.scaling"


def group_size(types: list[str]) -> int | None:
    """The ``layer_group_size`` that gives ``types`` (every g-th layer MLA, the rest KDA), if one does."""
    if FULL not in types:
        return None
    g = types.index(FULL) + 1
    return g if types == [FULL if (i + 1) % g == 0 else LINEAR for i in range(len(types))] else None


class BailingHybrid(KimiLinear):
    """BailingHybridForCausalLM: see the module docstring."""

    model_type, title, model_class, config_class = (
        "bailing_hybrid",
        "Bailing hybrid",
        "BailingHybridForCausalLM",
        "BailingHybridConfig",
    )
    parts = "KDA (full-rank gates, bounded decay) and gated MLA (interleaved RoPE) layers, DeepSeek-V3's MoE, dense first layers"
    position_kind = "rope"
    position_why = " (its MLA layers rotate qk_rope_head_dim dims)"
    scalings = ("none", "yarn")
    features = frozenset({LATENT_EPS, GATE, f"{SCALING}.kind", f"{SCALING}.truncate"}) | LAYERS | MTP_FEATURES
    mtp_keys = ("num_mtp_layers",)
    kda_rules = (("gate_rank", 0, " (its f_proj and g_proj are full-size)"),)
    layer_positions = "one RoPE for every layer"
    expert_matrices = ("gate_proj", "up_proj", "down_proj")
    # as the Hub's Ling checkpoints name them (transformers' conversion mapping)
    checkpoint_renames = {
        "model.word_embeddings.": "model.embed_tokens.",
        ".attention.": ".self_attn.",
        ".self_attn.dense.": ".self_attn.o_proj.",
        **{f"self_attn.{n}": f"self_attn.forget_gate.{n}" for n in ("f_proj.", "dt_bias", "A_log")},
        ".mlp.gate.expert_bias": ".mlp.gate.e_score_correction_bias",
    }

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().family_rules(cfg) + [
            (GATE, ("head",), " (its MLA layers always gate each head by g_proj)"),
            ("model.position.pairing", ("interleaved",), " (its MLA layers rotate interleaved pairs)"),
            MTP_RULE,
            *([("model.mlp.kind", ("moe",), " (its MTP layers are MLA MoE layers)")] if cfg.head.mtp.depth else []),
        ]

    def with_mtp(self, cfg: ModelConfig, c: Any, depth: int) -> ModelConfig:
        """The modules' blocks the model's own parts: MLA MoE layers, as the config's MTP types say where given."""
        for key, kind in (("mtp_layer_types", FULL), ("mtp_mlp_layer_types", "sparse")):
            types = getattr(c, key, None)
            if types is not None and list(types) != [kind] * depth:
                refuse_hf(c, key, f"{depth} x {kind!r} (archlab's modules are of the model's own MLA MoE parts)", types)
        return super().with_mtp(cfg, c, depth)

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """Kimi-Linear's, and KDA heads as many as the MLA layers' (one num_attention_heads sets both)."""
        found = super().part_problems(cfg)
        linear = next((lc.attention for lc in layer_configs(cfg) if is_kda(lc)), None)
        if linear is not None and linear.n_head != cfg.attention.n_head:
            why = " (num_attention_heads sets its KDA and MLA heads alike)"
            found.append(Problem("model.attention.n_head", cfg.attention.n_head, str(linear.n_head), why))
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        out = super().to_hf(cfg)
        for key in ("linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim"):
            out.pop(key, None)
        lcs = layer_configs(cfg)
        dense = [is_dense(lc) for lc in lcs]
        out |= dict(
            rope_parameters=rope_to_hf(cfg),
            num_mtp_layers=cfg.head.mtp.depth,
            first_k_dense_replace=dense.index(False) if False in dense else len(dense),
        )
        if cfg.head.mtp.depth:  # what transformers' MtpModel builds them from (an MLA MoE layer each)
            out |= dict(
                mtp_layer_types=[FULL] * cfg.head.mtp.depth, mtp_mlp_layer_types=["sparse"] * cfg.head.mtp.depth
            )
        size = group_size(out["layer_types"])
        if size is not None:
            out["layer_group_size"] = size
        linear = next((lc.attention for lc in lcs if is_kda(lc)), None)
        if linear is not None:
            out |= dict(head_dim=linear.head_dim, short_conv_kernel_size=linear.conv_kernel)
            out |= dict(kda_safe_gate=linear.decay == "bounded", kda_lower_bound=linear.decay_lower_bound)
        return out

    def position_from_hf(self, c: Any) -> PositionConfig:
        """RoPE over qk_rope_head_dim dims, pairs interleaved (transformers' apply_rotary_pos_emb_interleave)."""
        position = rope_from_hf(c, c.qk_rope_head_dim, partial=False, scalings=self.rope_types())
        position.pairing = "interleaved"
        return position

    def mla_from_hf(self, c: Any) -> MLAConfig:
        attention = super().mla_from_hf(c)
        attention.gate = "head"
        return attention

    def kda_from_hf(self, c: Any) -> dict[str, Any]:
        bounded = bool(c.kda_safe_gate)
        linear = dict(super().kda_from_hf(c), gate_rank=0, decay="bounded" if bounded else "softplus")
        return linear | (dict(decay_lower_bound=float(c.kda_lower_bound)) if bounded else {})

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return pre_norm_tensors(cfg, layer_attention_tensors)

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Kimi-Linear's (renames, stacked experts, q/k/v convolutions joined), without the MTP layers (read
        apart, ``families/mtp.py``)."""
        return super().from_checkpoint(cfg, without_mtp(cfg, state))


def kda_tensors(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """q, k, v, the forget gate's f_proj, g_proj and b_proj stacked as kda's in_proj (gate rank 0); conv1d,
    A_log ([H] there) and dt_bias, the gated norm, o_proj."""
    a = lc.attention
    W = a.n_head * a.head_dim
    rows = ["q_proj", "k_proj", "v_proj", "forget_gate.f_proj", "g_proj", "b_proj"]
    t.stacked(f"{archlab}.in_proj", [f"{hf}.{r}" for r in rows], False, (W, W, W, W, W, a.n_head))
    t.maps.append(TensorMap(f"{archlab}.conv_weight", (f"{hf}.conv1d.weight",), "depthwise_conv"))
    t.maps.append(TensorMap(f"{archlab}.A_log", (f"{hf}.forget_gate.A_log",)))
    t.maps.append(TensorMap(f"{archlab}.dt_bias", (f"{hf}.forget_gate.dt_bias",)))
    t.maps.append(TensorMap(f"{archlab}.norm_weight", (f"{hf}.o_norm.weight",)))
    t.add(f"{archlab}.proj", f"{hf}.o_proj")


def layer_attention_tensors(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
    """A layer's mixer: KDA's (``kda_tensors``) or the gated latent attention's (``mla_tensors`` and g_proj)."""
    if is_kda(lc):
        kda_tensors(t, lc, archlab, hf)
    else:
        mla_tensors(t, archlab, hf)
        t.add(f"{archlab}.gate", f"{hf}.g_proj")


RECORDS = (BailingHybrid(),)
