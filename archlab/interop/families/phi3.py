"""Phi-3 (Phi3ForCausalLM: Phi-3, Phi-3.5-mini, Phi-4-mini): LLaMA's layers with q/k/v fused into one
``qkv_proj`` and gate/up into one ``gate_up_proj``, partial RoPE, an optional sliding window on every
layer, and LongRoPE scaling."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    BlockConfig,
    ModelConfig,
    NormConfig,
    n_kv_head,
)
from archlab.interop.families.base import Family, Problem, Rule, no_embedding_dropout, out_bias
from archlab.interop.families.llama import _LlamaStyle
from archlab.interop.families.mlps import GATED_TO_HF, activation, gated_mlp
from archlab.interop.families.rope import rope_fraction, rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import dropouts, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mlp import d_ff


def fixed_head_dim(c: Any) -> int:
    """hidden_size / heads, the head size of families whose config class has no head_dim (a config that
    carries another one is refused: the rotary and attention modules would disagree on it)."""
    hd = c.hidden_size // c.num_attention_heads
    if getattr(c, "head_dim", None) not in (None, hd):
        refuse_hf(c, "head_dim", f"absent or hidden_size / num_attention_heads = {hd}")
    return hd


def head_dim_rule(cfg: ModelConfig, title: str) -> Rule:
    H, d = cfg.attention.n_head, cfg.d_model
    return ("model.attention.head_dim", (None, d // H), f" ({title} sets head_dim = hidden_size / heads)")


class Phi3(_LlamaStyle):
    """Phi3ForCausalLM: pre-norm RMSNorm, no biases, a gated MLP whose ``gate_up_proj`` holds archlab's
    [gate | up] rows and a ``qkv_proj`` holding [q | k | v] as archlab does, half-paired RoPE on a
    fraction of each head (``partial_rotary_factor``), an optional window on every layer, LongRoPE
    (``original_max_position_embeddings``, which Phi3Config keeps at the top level and copies over the
    rope_parameters' one, is ``model.position.scaling.original_context``). ``resid_pdrop`` drops the attention's and
    the MLP's outputs (``model.dropout``); transformers' Phi-3 never reads ``embd_pdrop`` and drops no
    embeddings (``model.embedding_dropout`` 0.0), so ``to_hf`` writes it 0.0 and ``from_hf`` ignores it."""

    model_type, title, model_class, config_class = "phi3", "Phi-3", "Phi3ForCausalLM", "Phi3Config"
    scalings = ("none", "longrope")
    features = frozenset(
        {
            "model.dropout",
            "model.embedding_dropout",
            "model.position.scaling.kind",
            "model.position.scaling.short_factor",
            "model.position.scaling.long_factor",
            "model.position.scaling.attention_factor",
            "model.attention.window",
        }
    )
    parts = "LLaMA's layers with fused q/k/v and gate/up, partial RoPE, LongRoPE, a window on every layer, GQA"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [no_embedding_dropout(cfg, self.title)]

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.attention.qkv_bias", (False,), ""),
            out_bias(False),
            ("model.mlp.bias", (False,), ""),
            head_dim_rule(cfg, self.title),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return Family.part_problems(self, cfg)  # any rotary fraction

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        a, p = cfg.attention, cfg.position
        return {
            **self.keys_to_hf(cfg),
            "intermediate_size": d_ff(cfg),
            "num_key_value_heads": n_kv_head(cfg),
            "hidden_act": GATED_TO_HF[activation(cfg.mlp)],
            # read over rope_parameters' copy by Phi3Config; unread without LongRoPE
            "original_max_position_embeddings": (
                p.scaling.original_context if p.scaling.kind == "longrope" else cfg.context_length
            ),
            "rope_parameters": rope_to_hf(cfg, rope_fraction(cfg)),
            "attention_dropout": a.dropout,
            "resid_pdrop": cfg.dropout,
            "embd_pdrop": 0.0,
            "sliding_window": a.window,
        }

    def from_hf(self, c: Any) -> ModelConfig:
        hd = fixed_head_dim(c)
        cfg = ModelConfig(
            **dropouts(c.resid_pdrop, 0.0),
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="pre"),
            position=rope_from_hf(c, hd, partial=True, scalings=("default", "longrope")),
            attention=AttentionConfig(
                n_kv_head=c.num_key_value_heads or c.num_attention_heads,
                qkv_bias=False,
                out_bias=False,
                dropout=float(c.attention_dropout),
                window=c.sliding_window,
            ),
            mlp=gated_mlp(c, "hidden_act"),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm")
            t.add(f"{b}.mlp_norm", f"{h}.post_attention_layernorm")
            t.add(f"{b}.attn.qkv", f"{h}.self_attn.qkv_proj")  # [q | k | v] rows, as archlab's
            t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj")
            t.add(f"{b}.mlp.gate_up", f"{h}.mlp.gate_up_proj")  # [gate | up] rows, as archlab's
            t.add(f"{b}.mlp.down", f"{h}.mlp.down_proj")
        t.add("final_norm", "model.norm")
        return t.head()


RECORDS: tuple[Family, ...] = (Phi3(),)
