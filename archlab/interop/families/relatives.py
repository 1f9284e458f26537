"""LLaMA's relatives with their own transformers classes, each a few changes to an existing record, in the
table ``RELATIVES``: Helium (interleaved RoPE), Seed-OSS (its own output bias and residual dropout), GLM v1
(GLM-4's attention and MLP in pre-norm blocks), CWM (Ministral's sliding layers with LLaMA's MLP biases),
VaultGemma (Gemma 2 without its post-sublayer norms) and Jais 2 (LayerNorm and a ReLU² up/down MLP)."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.arcee import UP_DOWN
from archlab.interop.families.base import LAYERS, Family, Rule, no_embedding_dropout, out_bias
from archlab.interop.families.gemma2 import Gemma2
from archlab.interop.families.glm4 import Glm4
from archlab.interop.families.layered import LayeredFamily
from archlab.interop.families.llama import LLAMA_KEYS, Llama, Mistral
from archlab.interop.families.tensors import TensorMap
from archlab.interop.families.values import dropouts


class Helium(Llama):
    """HeliumForCausalLM: LLaMA's layers with adjacent dims paired by RoPE, biases on q/k/v
    (``attention_bias``) and none on o_proj, MLP biases by ``mlp_bias``."""

    defers = True  # a LLaMA relative

    model_type, title, model_class, config_class = "helium", "Helium", "HeliumForCausalLM", "HeliumConfig"
    parts = "pre-norm RMSNorm, interleaved RoPE, GQA, SwiGLU, optional q/k/v and MLP biases"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        pairing = ("model.position.pairing", ("interleaved",), " (Helium rotates adjacent dims together)")
        return [pairing if r[0] == pairing[0] else r for r in super().rules(cfg)]

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [out_bias(False, " (o_proj has no bias)")]

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.position.pairing, cfg.attention.out_bias = "interleaved", False
        return cfg


class SeedOss(Llama):
    """SeedOssForCausalLM: LLaMA's layers with biases on q/k/v (``attention_bias``), o_proj
    (``attention_out_bias``) and the MLP (``mlp_bias``) each set apart, and the attention's and MLP's
    outputs dropped at ``residual_dropout`` (``model.dropout``; no embedding dropout)."""

    defers = True  # a LLaMA relative

    model_type, title, model_class, config_class = "seed_oss", "Seed-OSS", "SeedOssForCausalLM", "SeedOssConfig"
    features = Llama.features | {"model.dropout", "model.embedding_dropout"}
    parts = "LLaMA's layers with q/k/v, output and MLP biases each optional, residual dropout"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [*super().rules(cfg), no_embedding_dropout(cfg, self.title)]

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        return []

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), attention_out_bias=cfg.attention.out_bias, residual_dropout=cfg.dropout)

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.attention.out_bias = bool(c.attention_out_bias)
        drop = dropouts(c.residual_dropout, 0.0)
        cfg.dropout, cfg.embedding_dropout = drop["dropout"], drop["embedding_dropout"]
        return cfg


class Glm(Glm4):
    """GlmForCausalLM (GLM-4 v1, glm-4-9b): GLM-4's attention (interleaved partial RoPE, q/k/v biases)
    and fused gate/up MLP in pre-norm blocks (``input_layernorm``, ``post_attention_layernorm``)."""

    defers = True  # to GLM-4, its successor

    model_type, title, model_class, config_class = "glm", "GLM-4 (v1)", "GlmForCausalLM", "GlmConfig"
    block = "pre"
    norms = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
    parts = "pre-norm RMSNorm, interleaved partial RoPE, q/k/v biases, fused gate/up SwiGLU, GQA"


class Cwm(LayeredFamily, Mistral):
    """CwmForCausalLM (Code World Model): Ministral's layers (Mistral's, sliding or full as ``layer_types``
    says; llama3 RoPE as published), with MLP biases by ``mlp_bias``; no attention biases."""

    defers = True  # to SmolLM3, which holds its layouts too

    model_type, title, model_class, config_class = "cwm", "CWM", "CwmForCausalLM", "CwmConfig"
    features = Mistral.features | LAYERS
    parts = "pre-norm RMSNorm, RoPE (llama3), SwiGLU, `window` on any layers (`model.layers`), GQA"
    bos_token_id = 128000  # CwmConfig's: an int (None is refused); archlab holds no special tokens

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [("model.attention.qkv_bias", (False,), ""), out_bias(False)]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), mlp_bias=cfg.mlp.bias, bos_token_id=self.bos_token_id)

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.mlp.bias = bool(c.mlp_bias)
        return cfg


class VaultGemma(Gemma2):
    """VaultGemmaForCausalLM: Gemma 2's parts (scaled embeddings, (1 + w) RMSNorms, query_pre_attn_scalar,
    soft-capping, sliding layers) in pre-norm blocks: no norm after a sublayer."""

    defers = True  # a Gemma 2 relative

    model_type, title, model_class, config_class = (
        "vaultgemma",
        "VaultGemma",
        "VaultGemmaForCausalLM",
        "VaultGemmaConfig",
    )
    block = "pre"
    norms = {"attn_norm": "input_layernorm", "mlp_norm": "pre_feedforward_layernorm"}
    parts = "Gemma 2's parts in pre-norm blocks: soft-capping, query scale, local/global windows"


class Jais2(Llama):
    """Jais2ForCausalLM: LLaMA's attention (biases by ``attention_bias``) and names with LayerNorms that
    have a bias (``layer_norm_eps``) and Arcee's up/down MLP (ReLU² as published; ``mlp_bias``)."""

    defers = True  # to StarCoder 2, which holds its layouts too

    model_type, title, model_class, config_class = "jais2", "Jais 2", "Jais2ForCausalLM", "Jais2Config"
    parts = "pre-norm LayerNorm, RoPE, GQA, a plain up/down MLP (ReLU²), optional biases"
    keys = {**LLAMA_KEYS, "layer_norm_eps": "norm.eps"}
    mlp_form = UP_DOWN

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        rules = [
            ("model.norm.kind", ("layernorm",), "") if r[0] == "model.norm.kind" else r for r in super().rules(cfg)
        ]
        return [*rules, ("model.norm.bias", (True,), " (its LayerNorms have biases)")]

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.norm.kind, cfg.norm.bias = "layernorm", True
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        maps = super().tensors(cfg)
        norms = [m for m in maps if m.archlab.endswith("norm.weight")]
        return maps + [
            TensorMap(m.archlab[: -len("weight")] + "bias", (m.hf[0][: -len("weight")] + "bias",)) for m in norms
        ]


RECORDS: tuple[Family, ...] = (Helium(), SeedOss(), Glm(), Cwm(), VaultGemma(), Jais2())
