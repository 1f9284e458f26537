"""Falcon (``FalconForCausalLM``): LayerNorm, a plain MLP, one ``bias`` flag for every Linear, one fused
q/k/v Linear in three layouts, RoPE or (Falcon-RW) ALiBi."""

from __future__ import annotations

import math
from typing import Any

from archlab.config import (
    POSITION_OPTIONS,
    BlockConfig,
    ModelConfig,
    NormConfig,
    n_kv_head,
)
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule, out_bias
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import plain_activation, plain_mlp
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff


def alibi_scale(cfg: ModelConfig) -> float:
    """Falcon-RW's slope multiplier: its bias is divided by sqrt(head_dim) with the scores."""
    return 1 / math.sqrt(cfg.d_model // cfg.attention.n_head)


class Falcon(Family):
    """FalconForCausalLM. The old decoder architecture (Falcon-7B, Falcon-RW): one shared LayerNorm
    before attention and MLP in parallel (``parallel_attn``), or a pre-norm block; multi-query attention
    with the fused q/k/v laid out [q..., k, v] (``multi_query``), or one key and value per head laid out
    per head. The new one (Falcon-40B/180B, ``new_decoder_architecture``): a parallel block with
    ``ln_attn`` and ``ln_mlp`` (or one shared norm, ``num_ln_in_parallel_attn=1``), ``num_kv_heads``
    key/value heads, the fused q/k/v grouped per key/value head. One ``bias`` flag for q/k/v, output
    and MLP; LayerNorms with a shift, no head bias; full half-paired RoPE, or ALiBi (``alibi``, Falcon-RW:
    slopes times 1/sqrt(head_dim), slope · key position in bfloat16). Dropout refused: Falcon drops no
    embeddings, and its ``attention_dropout`` drops the sequential block's attention residual (and only
    under ALiBi the attention probabilities)."""

    model_type, title, model_class, config_class = "falcon", "Falcon", "FalconForCausalLM", "FalconConfig"
    keys = {**LLAMA_KEYS, "layer_norm_epsilon": "norm.eps"}
    prefix = "transformer."
    position_kind = ("rope", "alibi")
    features = frozenset({"model.position.scaling.kind", "model.position.alibi_scale", "model.position.alibi_rounding"})
    parts = (
        "layernorm, parallel (one or two norms) or pre block, plain MLP, MHA/MQA (old) or GQA (new architecture), "
        "one bias flag, rope or alibi (Falcon-RW)"
    )

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        a, H = cfg.attention, cfg.attention.n_head
        one_bias = " (one bias flag sets q/k/v, output and MLP)"
        rules: list[Rule] = [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.block.kind", ("parallel", "pre"), ""),
            ("model.mlp.kind", ("gelu", "relu"), ""),
            ("model.attention.head_dim", (None, cfg.d_model // H), " (Falcon uses d_model / n_head)"),
            out_bias(a.qkv_bias, one_bias),
            ("model.mlp.bias", (a.qkv_bias,), one_bias),
            ("model.attention.dropout", (0.0,), " (Falcon's attention_dropout drops its residual, not scores)"),
            NO_HEAD_BIAS,
        ]
        if cfg.block.kind == "pre":  # the old architecture: a key and value per head, or one for all
            why = " (Falcon's sequential block is its old architecture: MHA or MQA)"
            rules.append(("model.attention.n_kv_head", (None, H, 1), why))
        if cfg.position.kind == "rope":
            rules.append(("model.position.pairing", ("half",), ""))
            rules.append(("model.position.alibi_scale", (1.0,), " (ALiBi's slopes as Press et al.)"))
            rules.append(("model.position.alibi_rounding", ("none",), " (ALiBi's bias in float32)"))
        else:
            why = " (Falcon-RW's ALiBi: slopes over sqrt(head_dim), slope · key position in bfloat16)"
            rules.append(("model.position.alibi_scale", (alibi_scale(cfg),), why))
            rules.append(("model.position.alibi_rounding", ("bf16",), why))
        return rules

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return super().part_problems(cfg) + (self.full_rotary(cfg) if cfg.position.kind == "rope" else [])

    @staticmethod
    def new_architecture(cfg: ModelConfig) -> bool:
        """A parallel block with two norms, or with GQA (neither MHA nor MQA), is the new architecture."""
        H, KV = cfg.attention.n_head, n_kv_head(cfg)
        return cfg.block.kind == "parallel" and (not cfg.block.shared_norm or KV not in (1, H))

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        a, new = cfg.attention, self.new_architecture(cfg)
        alibi = cfg.position.kind == "alibi"
        kwargs: dict[str, Any] = dict(
            self.keys_to_hf(cfg),
            num_kv_heads=n_kv_head(cfg),
            new_decoder_architecture=new,
            multi_query=not new and n_kv_head(cfg) == 1,
            parallel_attn=cfg.block.kind == "parallel",
            num_ln_in_parallel_attn=(1 if cfg.block.shared_norm else 2) if new else None,
            bias=a.qkv_bias,
            ffn_hidden_size=d_ff(cfg),
            activation=plain_activation(cfg),
            alibi=alibi,
            hidden_dropout=0.0,
            attention_dropout=0.0,
        )
        if not alibi:
            kwargs["rope_parameters"] = rope_to_hf(cfg)
        return kwargs

    def from_hf(self, c: Any) -> ModelConfig:
        H, new = c.num_attention_heads, bool(c.new_decoder_architecture)
        for name in ("hidden_dropout", "attention_dropout"):
            if getattr(c, name):
                refuse_hf(c, name, "0.0 (Falcon drops no embeddings; archlab's dropouts are not Falcon's)")
        n_ln = getattr(c, "num_ln_in_parallel_attn", None)
        if new:
            if not c.parallel_attn:
                refuse_hf(c, "parallel_attn", "true with new_decoder_architecture (transformers builds no such block)")
            block = BlockConfig(kind="parallel", shared_norm=n_ln == 1)
            kv = c.num_kv_heads
        else:
            if c.parallel_attn and n_ln not in (None, 1):
                refuse_hf(c, "num_ln_in_parallel_attn", "null or 1 without new_decoder_architecture (one norm)")
            block = BlockConfig(kind="parallel", shared_norm=True) if c.parallel_attn else BlockConfig(kind="pre")
            if not c.multi_query and c.num_kv_heads != H:
                refuse_hf(c, "num_kv_heads", f"{H}=num_attention_heads (the old architecture without multi_query)")
            kv = 1 if c.multi_query else H
        hd = c.hidden_size // H
        if c.alibi:
            position = POSITION_OPTIONS.make(kind="alibi", alibi_scale=1 / math.sqrt(hd), alibi_rounding="bf16")
        else:
            position = rope_from_hf(c, hd, partial=False)
        mlp = plain_mlp(c, "activation", c.ffn_hidden_size)
        mlp.bias = bool(c.bias)
        cfg = ModelConfig(
            norm=NormConfig(kind="layernorm", bias=True),
            block=block,
            position=position,
            attention=AttentionConfig(n_kv_head=kv, qkv_bias=bool(c.bias), out_bias=bool(c.bias)),
            mlp=mlp,
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, bias, H, KV, hd = Tensors(cfg), cfg.attention.qkv_bias, cfg.attention.n_head, n_kv_head(cfg), head_dim(cfg)
        if self.new_architecture(cfg):
            qkv: tuple[str, tuple[int, ...]] = ("kv_grouped", (H, KV, hd))
        else:  # MQA: [q..., k, v], archlab's own order; MHA: [q_h, k_h, v_h] per head
            qkv = ("same", ()) if KV == 1 else ("heads_interleaved", (H, hd))
        if cfg.block.kind == "pre":
            norms = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
        elif cfg.block.shared_norm:
            norms = {"attn_norm": "input_layernorm"}
        else:
            norms = {"attn_norm": "ln_attn", "mlp_norm": "ln_mlp"}
        t.add("tok_emb", "transformer.word_embeddings")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"transformer.h.{i}"
            for archlab, hf in norms.items():
                t.add(f"{b}.{archlab}", f"{h}.{hf}", True)
            t.add(f"{b}.attn.qkv", f"{h}.self_attention.query_key_value", bias, *qkv)
            t.add(f"{b}.attn.proj", f"{h}.self_attention.dense", bias)
            t.add(f"{b}.mlp.fc", f"{h}.mlp.dense_h_to_4h", bias)
            t.add(f"{b}.mlp.proj", f"{h}.mlp.dense_4h_to_h", bias)
        t.add("final_norm", "transformer.ln_f", True)
        return t.head()


RECORDS: tuple[Family, ...] = (Falcon(),)
