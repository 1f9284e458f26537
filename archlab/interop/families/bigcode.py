"""GPTBigCode (``GPTBigCodeForCausalLM``: SantaCoder, StarCoder): GPT-2's layout in nn.Linear layers, with
multi-query attention (``multi_query``) in one fused ``c_attn``."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    POSITION_OPTIONS,
    BlockConfig,
    ModelConfig,
    NormConfig,
    embedding_dropout,
    n_kv_head,
)
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Rule, fmt, out_bias
from archlab.interop.families.gpt import GPT_KEYS
from archlab.interop.families.mlps import PLAIN_FROM_HF, PLAIN_TO_HF, activation, mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import dropouts, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff


class GPTBigCode(Family):
    """GPTBigCodeForCausalLM: pre-norm LayerNorm, learned positions, biases on every Linear, a plain MLP,
    no head bias; one key/value head (``multi_query``, c_attn's rows [Q | K | V] as archlab's) or one per
    query head (c_attn laid out per head, [q_h, k_h, v_h], as GPT-NeoX's); scores scaled by
    1/sqrt(head_dim) or, ``scale_attn_weights`` false, not at all (``model.attention.scale`` 1.0).
    ``attention_softmax_in_fp32`` and ``scale_attention_softmax_in_fp32`` are numerics transformers'
    class stores but does not read (its attention takes the softmax in float32 whatever they say):
    accepted, not read, written as their defaults."""

    model_type, title, model_class, config_class = (
        "gpt_bigcode",
        "GPTBigCode",
        "GPTBigCodeForCausalLM",
        "GPTBigCodeConfig",
    )
    keys = GPT_KEYS
    prefix = "transformer."
    features = frozenset({"model.dropout", "model.embedding_dropout", "model.attention.scale"})
    position_kind = "learned"
    parts = "GPT-2's layout (pre-norm LayerNorm, learned positions, plain MLP, biases), MQA, unscaled scores"
    # StarCoder's and SantaCoder's tanh GELUs; gelu_fast is the same formula, its constant written out
    activations_from_hf = {**PLAIN_FROM_HF, "gelu_fast": ("gelu", "tanh")}
    activations_to_hf = {**PLAIN_TO_HF, ("gelu", "tanh"): "gelu_pytorch_tanh"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        H, d = cfg.attention.n_head, cfg.d_model
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.block.kind", ("pre",), ""),
            ("model.mlp.kind", ("gelu", "relu"), ""),
            ("model.mlp.bias", (True,), ""),
            ("model.attention.qkv_bias", (True,), " (c_attn always has a bias)"),
            out_bias(True, " (c_proj always has a bias)"),
            ("model.attention.n_kv_head", (None, H, 1), " (multi_query: one key/value head, or one per query head)"),
            ("model.attention.head_dim", (None, d // H), f" ({self.title} uses d_model / n_head)"),
            ("model.attention.scale", (None, 1.0), " (scale_attn_weights: 1/sqrt(head_dim), or none)"),
            NO_HEAD_BIAS,
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            self.keys_to_hf(cfg),
            n_inner=d_ff(cfg),
            activation_function=self.activations_to_hf[activation(cfg.mlp)],
            resid_pdrop=cfg.dropout,
            embd_pdrop=embedding_dropout(cfg),
            attn_pdrop=cfg.attention.dropout,
            scale_attn_weights=cfg.attention.scale is None,
            multi_query=n_kv_head(cfg) == 1 and cfg.attention.n_head > 1,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.add_cross_attention:
            refuse_hf(c, "add_cross_attention", f"{fmt(False)} (archlab attention is causal self-attention)")
        name = c.activation_function
        if name not in self.activations_from_hf:
            refuse_hf(c, "activation_function", f"one of {sorted(self.activations_from_hf)}")
        kind, approximate = self.activations_from_hf[name]
        cfg = ModelConfig(
            **dropouts(c.resid_pdrop, c.embd_pdrop),
            norm=NormConfig(kind="layernorm", bias=True),
            block=BlockConfig(kind="pre"),
            position=POSITION_OPTIONS.make(kind="learned"),
            attention=AttentionConfig(
                n_kv_head=1 if c.multi_query else None,
                scale=None if c.scale_attn_weights else 1.0,
                dropout=float(c.attn_pdrop),
            ),
            mlp=mlp_section(kind, d_ff=c.n_inner or 4 * c.n_embd, bias=True, approximate=approximate),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        H = cfg.attention.n_head
        # multi-query: rows [Q | K | V] as archlab's; else [q_h, k_h, v_h] per head
        fused = ("same", ()) if n_kv_head(cfg) == 1 and H > 1 else ("heads_interleaved", (H, head_dim(cfg)))
        t.add("tok_emb", "transformer.wte")
        t.add("position.table", "transformer.wpe")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"transformer.h.{i}"
            t.add(f"{b}.attn_norm", f"{h}.ln_1", True)
            t.add(f"{b}.attn.qkv", f"{h}.attn.c_attn", True, *fused)
            t.add(f"{b}.attn.proj", f"{h}.attn.c_proj", True)
            t.add(f"{b}.mlp_norm", f"{h}.ln_2", True)
            t.add(f"{b}.mlp.fc", f"{h}.mlp.c_fc", True)
            t.add(f"{b}.mlp.proj", f"{h}.mlp.c_proj", True)
        t.add("final_norm", "transformer.ln_f", True)
        return t.head()


RECORDS: tuple[Family, ...] = (GPTBigCode(),)
