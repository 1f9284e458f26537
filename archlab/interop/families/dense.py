"""The dense families by ``model_type`` (``DENSE``), and the table that routes an archlab layout to one."""

from __future__ import annotations

from archlab.config import (
    ModelConfig,
    n_kv_head,
)
from archlab.config.layers import layer_configs
from archlab.errors import ConfigError
from archlab.interop.families.base import Family
from archlab.interop.families.bigcode import BIGCODE
from archlab.interop.families.bloom import BLOOM
from archlab.interop.families.gpt import GPT2, GPTJ
from archlab.interop.families.llama import Gemma, Gemma2, Llama, Mistral, Olmo2, Qwen2, Qwen3
from archlab.interop.families.ministral import MINISTRAL
from archlab.interop.families.neox import GPTNeoX, Phi
from archlab.interop.families.opt import OPT
from archlab.nn.mixers.base import window_of

DENSE: dict[str, Family] = {
    f.model_type: f
    for f in (GPT2(), GPTJ(), GPTNeoX(), Phi(), Llama(), Mistral(), Qwen2(), Qwen3(), Gemma(), Gemma2(), Olmo2())
}


def dense_family(cfg: ModelConfig) -> Family:
    """The dense family an archlab layout maps to, by this table (its ``check`` then refuses what it cannot
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
        return OPT["opt"]
    if block == "pre" and position == "learned":
        return BIGCODE["gpt_bigcode"] if n_kv_head(cfg) != a.n_head else DENSE["gpt2"]
    if block == "pre" and position == "alibi":
        return BLOOM["bloom"]
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
            return DENSE["gpt_neox"]
        return DENSE["phi" if a.qkv_bias else "gptj"]
    if block == "sandwich":
        return DENSE["gemma2"]
    if block == "post_sublayer":
        return DENSE["olmo2"]
    if cfg.norm.kind == "layernorm":
        return DENSE["gpt_neox"]
    if cfg.norm.unit_offset or cfg.scale_embedding:
        return DENSE["gemma"]
    if a.qk_norm == "head":
        return DENSE["qwen3"]
    if a.qkv_bias and not a.out_bias:
        return DENSE["qwen2"]
    if len({window_of(lc) is None for lc in layer_configs(cfg)}) > 1:
        return MINISTRAL["ministral"]
    if a.window is not None:
        return DENSE["mistral"]
    return DENSE["llama"]
