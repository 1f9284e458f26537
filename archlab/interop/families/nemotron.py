"""Nemotron (``NemotronForCausalLM``, the dense Nemotron-3/-4 and Minitron): pre-norm LayerNorm1P (a
LayerNorm with a bias whose scale is stored as w and applied as 1 + w: archlab's ``norm.unit_offset`` on
``layernorm``), separate q/k/v with GQA and an explicit head_dim, half-paired partial RoPE (0.5 as
published), and Arcee's up/down MLP (the squared ReLU as published)."""

from __future__ import annotations

from typing import Any

from archlab.config import BlockConfig, ModelConfig, NormConfig, n_kv_head
from archlab.interop.families.arcee import UP_DOWN_KINDS, UP_DOWN_TO_HF, up_down_mlp, up_down_tensors
from archlab.interop.families.base import NO_HEAD_BIAS, ONE_BIAS_FLAG, Family, Rule, out_bias
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import activation
from archlab.interop.families.rope import rope_fraction, rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff


class Nemotron(Family):
    """NemotronForCausalLM: see the module docstring."""

    model_type, title, model_class, config_class = "nemotron", "Nemotron", "NemotronForCausalLM", "NemotronConfig"
    keys = {**LLAMA_KEYS, "norm_eps": "norm.eps"}
    prefix = "model."
    features = frozenset({"model.position.scaling.kind", "model.norm.unit_offset"})
    parts = "pre-norm (1 + w) LayerNorm, partial RoPE, GQA, a plain up/down MLP (ReLU²)"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), " (LayerNorm1P has a bias)"),
            ("model.norm.unit_offset", (True,), " (LayerNorm1P's scale is 1 + w)"),
            ("model.block.kind", ("pre",), ""),
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.kind", UP_DOWN_KINDS, " (its MLP is up_proj, then down_proj, without a gate)"),
            NO_HEAD_BIAS,
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        a = cfg.attention
        return {
            **self.keys_to_hf(cfg),
            "intermediate_size": d_ff(cfg),
            "num_key_value_heads": n_kv_head(cfg),
            "head_dim": head_dim(cfg),
            "hidden_act": UP_DOWN_TO_HF[activation(cfg.mlp)],
            "rope_parameters": rope_to_hf(cfg, rope_fraction(cfg)),
            "attention_dropout": a.dropout,
            "attention_bias": a.qkv_bias,
            "mlp_bias": cfg.mlp.bias,
        }

    def from_hf(self, c: Any) -> ModelConfig:
        bias = bool(c.attention_bias)
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="layernorm", bias=True, unit_offset=True),
            block=BlockConfig(kind="pre"),
            position=rope_from_hf(c, c.head_dim, partial=True),
            attention=AttentionConfig(
                n_kv_head=c.num_key_value_heads or c.num_attention_heads,
                head_dim=c.head_dim,
                qkv_bias=bias,
                out_bias=bias,
                dropout=float(c.attention_dropout),
            ),
            mlp=up_down_mlp(c),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, a = Tensors(cfg), cfg.attention
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm", bias=True)
            t.add(f"{b}.mlp_norm", f"{h}.post_attention_layernorm", bias=True)
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", a.qkv_bias)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj", a.out_bias)
            up_down_tensors(t, f"{b}.mlp", f"{h}.mlp")
        t.add("final_norm", "model.norm", bias=True)
        return t.head()


RECORDS: tuple[Family, ...] = (Nemotron(),)
