"""Persimmon (``PersimmonForCausalLM``: Persimmon-8B, Fuyu's decoder): pre-norm LayerNorms, GPT-NeoX's per-head
fused q/k/v with biases, a LayerNorm of q and k per head, partial half-paired RoPE, a squared-ReLU MLP."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    BlockConfig,
    ModelConfig,
    NormConfig,
)
from archlab.interop.families.arcee import UP_DOWN_FROM_HF, UP_DOWN_KINDS, UP_DOWN_TO_HF
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Rule, fmt, out_bias
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import activation, mlp_section
from archlab.interop.families.rope import rope_fraction, rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff


class Persimmon(Family):
    """PersimmonForCausalLM: pre-norm LayerNorms with biases, one ``query_key_value`` holding [q_h, k_h, v_h]
    per head h (as GPT-NeoX's), q and k LayerNormed per head before RoPE (``qk_layernorm``: one scale and
    shift of head_dim shared by the heads, the model's eps), partial half-paired RoPE
    (``partial_rotary_factor``, 0.5 in the published models), biases on every Linear, a plain MLP (ReLU² as
    published), no head bias. ``hidden_dropout`` drops the MLP's output alone, not the attention's:
    refused unless 0; ``attention_dropout`` drops the attention probabilities."""

    defers = True  # to Jais 2, whose layouts with whole-head RoPE it holds too

    model_type, title, model_class, config_class = "persimmon", "Persimmon", "PersimmonForCausalLM", "PersimmonConfig"
    keys = {**LLAMA_KEYS, "layer_norm_eps": "norm.eps"}
    prefix = "model."
    features = frozenset({"model.attention.qk_norm", "model.position.scaling.kind"})
    parts = "pre-norm LayerNorm, per-head fused q/k/v, per-head QK LayerNorm, partial RoPE, ReLU² MLP, biases"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.block.kind", ("pre",), ""),
            ("model.position.pairing", ("half",), ""),
            ("model.attention.qkv_bias", (True,), ""),
            out_bias(True),
            ("model.attention.qk_norm", ("none", "head"), " (qk_layernorm is per head)"),
            *self.mha_rules(cfg),
            ("model.mlp.kind", UP_DOWN_KINDS, ""),
            ("model.mlp.bias", (True,), ""),
            NO_HEAD_BIAS,
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            self.keys_to_hf(cfg),
            intermediate_size=d_ff(cfg),
            hidden_act=UP_DOWN_TO_HF[activation(cfg.mlp)],
            rope_parameters=rope_to_hf(cfg, rope_fraction(cfg)),
            qk_layernorm=cfg.attention.qk_norm == "head",
            hidden_dropout=0.0,
            attention_dropout=cfg.attention.dropout,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.hidden_dropout != 0:
            refuse_hf(c, "hidden_dropout", f"{fmt(0.0)} (it drops the MLP's output alone; archlab every sublayer's)")
        if c.hidden_act not in UP_DOWN_FROM_HF:
            refuse_hf(c, "hidden_act", f"one of {sorted(UP_DOWN_FROM_HF)}")
        kind, approximate = UP_DOWN_FROM_HF[c.hidden_act]
        cfg = ModelConfig(
            norm=NormConfig(kind="layernorm", bias=True),
            block=BlockConfig(kind="pre"),
            position=rope_from_hf(c, c.hidden_size // c.num_attention_heads, partial=True),
            attention=AttentionConfig(
                qk_norm="head" if c.qk_layernorm else "none",
                dropout=float(c.attention_dropout),
            ),
            mlp=mlp_section(kind, d_ff=c.intermediate_size, bias=True, approximate=approximate),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, H = Tensors(cfg), cfg.attention.n_head
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm", True)
            t.add(f"{b}.attn.qkv", f"{h}.self_attn.query_key_value", True, "heads_interleaved", (H, head_dim(cfg)))
            if cfg.attention.qk_norm == "head":
                t.add(f"{b}.attn.q_norm", f"{h}.self_attn.q_layernorm", True)
                t.add(f"{b}.attn.k_norm", f"{h}.self_attn.k_layernorm", True)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.dense", True)
            t.add(f"{b}.mlp_norm", f"{h}.post_attention_layernorm", True)
            t.add(f"{b}.mlp.fc", f"{h}.mlp.dense_h_to_4h", True)
            t.add(f"{b}.mlp.proj", f"{h}.mlp.dense_4h_to_h", True)
        t.add("final_norm", "model.final_layernorm", True)
        return t.head()


RECORDS: tuple[Family, ...] = (Persimmon(),)
