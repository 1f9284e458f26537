"""The table that routes an archlab layout to a dense family (its record, as ``FAMILIES`` holds it)."""

from __future__ import annotations

from archlab.config import (
    ModelConfig,
    n_kv_head,
)
from archlab.config.layers import layer_configs
from archlab.errors import ConfigError
from archlab.interop.families.base import Family
from archlab.nn.mixers.base import window_of

# every model_type ``dense_type`` answers, the first families ``FAMILIES`` lists, in this order
ROUTES = (
    "gpt2",
    "gptj",
    "gpt_neox",
    "phi",
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "olmo2",
    "ministral",
    "opt",
    "gpt_bigcode",
    "bloom",
)


def dense_family(cfg: ModelConfig) -> Family:
    """The dense family an archlab layout maps to, by ``dense_type``'s table: its record in ``FAMILIES``."""
    from archlab.interop.families import FAMILIES  # the package imports this module while it collects them

    return FAMILIES[dense_type(cfg)]


def dense_type(cfg: ModelConfig) -> str:
    """The ``model_type`` of the dense family an archlab layout maps to, by this table (its ``check`` then refuses what it cannot
    hold; a moe MLP or mla attention goes to ``moe.sparse_family`` instead):

    ============================================================  ============
    post-norm, or pre-norm with model.embedding_dim; learned pos. OPT
    pre-norm, learned positions, fewer key/value heads            GPTBigCode
    pre-norm, learned positions                                   GPT-2
    pre-norm, ALiBi                                               BLOOM
    parallel block, one shared norm, RoPE, no q/k/v bias          GPT-J
    parallel block, one shared norm, RoPE, q/k/v bias             Phi
    parallel block with two norms, or pre-norm LayerNorm; RoPE    GPT-NeoX
    pre-norm RMSNorm + RoPE, with a (1 + w) norm or scaled emb.   Gemma
    ... else with a per-head QK-norm                              Qwen3
    ... else with q/k/v biases but no output bias                 Qwen2
    ... else with a sliding window on some layers, not all        Ministral
    ... else with a sliding window                                Mistral
    ... else                                                      LLaMA
    sandwich block, RoPE                                          Gemma 2
    post_sublayer block, RoPE                                     OLMo 2
    ============================================================  ============
    """
    block, position, a = cfg.block.kind, cfg.position.kind, cfg.attention
    if position == "learned" and (block == "post" or block == "pre" and cfg.embedding_dim is not None):
        return "opt"
    if block == "pre" and position == "learned":
        return "gpt_bigcode" if n_kv_head(cfg) != a.n_head else "gpt2"
    if block == "pre" and position == "alibi":
        return "bloom"
    if block not in ("pre", "parallel", "sandwich", "post_sublayer"):
        raise ConfigError(
            "model.block.kind",
            block,
            "pre, post with learned positions (OPT), parallel, sandwich (Gemma 2) or post_sublayer (OLMo 2) "
            "to convert to Hugging Face",
        )
    if position != "rope":
        allowed = (
            "learned (GPT-2, GPTBigCode, OPT), alibi (BLOOM) or rope (every other family)"
            if block == "pre"
            else f"rope with model.block.kind={block}"
        )
        raise ConfigError("model.position.kind", position, f"{allowed} to convert to Hugging Face")
    if block == "parallel":
        if not cfg.block.shared_norm:
            return "gpt_neox"
        return "phi" if a.qkv_bias else "gptj"
    if block == "sandwich":
        return "gemma2"
    if block == "post_sublayer":
        return "olmo2"
    if cfg.norm.kind == "layernorm":
        return "gpt_neox"
    if cfg.norm.unit_offset or cfg.scale_embedding:
        return "gemma"
    if a.qk_norm == "head":
        return "qwen3"
    if a.qkv_bias and not a.out_bias:
        return "qwen2"
    if len({window_of(lc) is None for lc in layer_configs(cfg)}) > 1:
        return "ministral"
    if a.window is not None:
        return "mistral"
    return "llama"
