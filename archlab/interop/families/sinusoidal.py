"""XGLM and CTRL: pre-norm LayerNorm blocks over fixed sinusoidal positions, laid out as every sine then
every cosine (``model.position.layout: halves``): fairseq's table for XGLM (two leading rows, so
``offset`` 2, and frequencies reaching 1/10000: ``endpoint``), CTRL's own (no offset, Vaswani's
frequencies); token embeddings scaled by √d_model, q/k/v, output and MLP Linears with biases."""

from __future__ import annotations

from typing import Any

from archlab.config import POSITION_OPTIONS, BlockConfig, ModelConfig, NormConfig, embedding_dropout
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Rule, fmt, out_bias
from archlab.interop.families.mlps import mlp_section, plain_activation, plain_mlp
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import dropouts, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mlp import d_ff

XGLM_OFFSET = 2  # fairseq's table: position p at row p + 2 (rows 0 and 1 before position 0)
XGLM_EPS = 1e-5  # XGLM's LayerNorms are torch's default: its config has no key for their eps
CTRL_EPS = 1e-6  # CTRL's block LayerNorms are built with 1e-6 whatever its layer_norm_epsilon


def _biased_pre_norm(eps: float, why: str) -> list[Rule]:
    """The rules XGLM and CTRL share: pre-norm LayerNorms of ``eps``, biases on every Linear."""
    return [
        ("model.norm.kind", ("layernorm",), ""),
        ("model.norm.bias", (True,), ""),
        ("model.norm.eps", (eps,), why),
        ("model.block.kind", ("pre",), ""),
        ("model.attention.qkv_bias", (True,), ""),
        out_bias(True),
        ("model.mlp.bias", (True,), ""),
    ]


class XGLM(Family):
    """XGLMForCausalLM: fairseq's decoder. Pre-norm LayerNorms of eps 1e-5 (torch's default), token
    embeddings times √d_model where ``scale_embedding``, fairseq's sinusoidal table (sines then cosines,
    frequencies 10000^(-i/(d/2 - 1)), position p at row p + 2: ``layout: halves``, ``endpoint``, ``offset``
    2), q/k/v, output and MLP Linears with biases, a final norm, no head bias. ``dropout`` drops the
    embeddings and each sublayer's output, ``attention_dropout`` the attention probabilities;
    ``activation_dropout`` and ``layerdrop`` are refused unless 0, cross-attention always."""

    model_type, title, model_class, config_class = "xglm", "XGLM", "XGLMForCausalLM", "XGLMConfig"
    keys = {
        "vocab_size": "vocab_size",
        "max_position_embeddings": "context_length",
        "d_model": "d_model",
        "num_layers": "n_layer",
        "attention_heads": "attention.n_head",
        "init_std": "init_std",
        "tie_word_embeddings": "head.tied",
    }
    prefix = "model."
    features = frozenset({"model.dropout", "model.scale_embedding"})
    position_kind = "sinusoidal"
    position_why = " (fairseq's table)"
    parts = "pre-norm LayerNorm, √d_model embedding scale, fairseq sinusoidal positions (halves, offset 2), biases"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            *_biased_pre_norm(XGLM_EPS, " (XGLM's LayerNorms use torch's default)"),
            ("model.mlp.kind", ("gelu", "relu"), ""),
            ("model.position.layout", ("halves",), " (fairseq's table: sines, then cosines)"),
            ("model.position.offset", (XGLM_OFFSET,), " (fairseq's table starts two rows before position 0)"),
            ("model.position.endpoint", (True,), " (fairseq's frequencies reach 1/10000)"),
            *self.mha_rules(cfg),
            NO_HEAD_BIAS,
            ("model.embedding_dropout", (None,), " (dropout drops the embeddings too)"),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            self.keys_to_hf(cfg),
            ffn_dim=d_ff(cfg),
            activation_function=plain_activation(cfg),
            dropout=cfg.dropout,
            attention_dropout=cfg.attention.dropout,
            activation_dropout=0.0,
            layerdrop=0.0,
            scale_embedding=cfg.scale_embedding,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        for name in ("layerdrop", "activation_dropout"):
            if getattr(c, name) != 0:
                refuse_hf(c, name, f"{fmt(0.0)} (archlab runs every layer and drops no MLP activations)")
        if c.add_cross_attention:
            refuse_hf(c, "add_cross_attention", "false (archlab's decoder has no cross-attention)")
        if c.pad_token_id is not None and c.pad_token_id >= XGLM_OFFSET:  # that row of the table is zeroed
            refuse_hf(c, "pad_token_id", "null, 0 or 1 (XGLM zeroes the table's row pad_token_id, a position's)")
        cfg = ModelConfig(
            **dropouts(c.dropout, c.dropout),
            scale_embedding=bool(c.scale_embedding),
            norm=NormConfig(kind="layernorm", eps=XGLM_EPS, bias=True),
            block=BlockConfig(kind="pre"),
            position=POSITION_OPTIONS.make(kind="sinusoidal", layout="halves", offset=XGLM_OFFSET, endpoint=True),
            attention=AttentionConfig(dropout=float(c.attention_dropout)),
            mlp=plain_mlp(c, "activation_function", c.ffn_dim),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, d = Tensors(cfg), "model"
        t.add("tok_emb", f"{d}.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"{d}.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.self_attn_layer_norm", True)
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", True)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.out_proj", True)
            t.add(f"{b}.mlp_norm", f"{h}.final_layer_norm", True)
            t.add(f"{b}.mlp.fc", f"{h}.fc1", True)
            t.add(f"{b}.mlp.proj", f"{h}.fc2", True)
        t.add("final_norm", f"{d}.layer_norm", True)
        return t.head()


class CTRL(Family):
    """CTRLLMHeadModel: pre-norm LayerNorms of eps 1e-6 (the blocks' are built so; the final one reads
    ``layer_norm_epsilon``, refused unless 1e-6), token embeddings always times √d_model, CTRL's sinusoidal
    table (``positional_encoding``: sines then cosines of Vaswani's frequencies, ``layout: halves``), q/k/v
    (``Wq``, ``Wk``, ``Wv``), output and ReLU MLP Linears with biases, a head bias. ``embd_pdrop`` drops the
    embeddings, ``resid_pdrop`` each sublayer's output; its attention drops nothing."""

    model_type, title, model_class, config_class = "ctrl", "CTRL", "CTRLLMHeadModel", "CTRLConfig"
    keys = {
        "vocab_size": "vocab_size",
        "n_positions": "context_length",
        "n_embd": "d_model",
        "n_layer": "n_layer",
        "n_head": "attention.n_head",
        "initializer_range": "init_std",
        "layer_norm_epsilon": "norm.eps",
        "tie_word_embeddings": "head.tied",
    }
    prefix = "transformer."
    features = frozenset({"model.dropout", "model.embedding_dropout", "model.scale_embedding"})
    position_kind = "sinusoidal"
    position_why = " (CTRL's table)"
    parts = "pre-norm LayerNorm, √d_model embedding scale, sinusoidal positions (halves), ReLU MLP, head bias"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            *_biased_pre_norm(CTRL_EPS, " (CTRL's block LayerNorms are built with 1e-6)"),
            ("model.mlp.kind", ("relu",), ""),
            ("model.scale_embedding", (True,), " (CTRL scales its embeddings by √d_model)"),
            ("model.position.layout", ("halves",), " (CTRL's table: sines, then cosines)"),
            ("model.position.offset", (0,), ""),
            ("model.position.endpoint", (False,), " (CTRL's frequencies are Vaswani's)"),
            ("model.attention.dropout", (0.0,), " (CTRL's attention drops nothing)"),
            *self.mha_rules(cfg),
            ("model.head.bias", (True,), ""),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(self.keys_to_hf(cfg), dff=d_ff(cfg), resid_pdrop=cfg.dropout, embd_pdrop=embedding_dropout(cfg))

    def from_hf(self, c: Any) -> ModelConfig:
        if c.layer_norm_epsilon != CTRL_EPS:
            refuse_hf(c, "layer_norm_epsilon", f"{fmt(CTRL_EPS)} (CTRL's block LayerNorms are built with 1e-6)")
        cfg = ModelConfig(
            **dropouts(c.resid_pdrop, c.embd_pdrop),
            scale_embedding=True,
            norm=NormConfig(kind="layernorm", bias=True),
            block=BlockConfig(kind="pre"),
            position=POSITION_OPTIONS.make(kind="sinusoidal", layout="halves"),
            attention=AttentionConfig(),
            mlp=mlp_section("relu", d_ff=c.dff, bias=True),
        )
        cfg.head.bias = True
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "transformer.w")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"transformer.h.{i}"
            t.add(f"{b}.attn_norm", f"{h}.layernorm1", True)
            t.stacked(f"{b}.attn.qkv", [f"{h}.multi_head_attention.W{x}" for x in "qkv"], True, (cfg.d_model,) * 3)
            t.add(f"{b}.attn.proj", f"{h}.multi_head_attention.dense", True)
            t.add(f"{b}.mlp_norm", f"{h}.layernorm2", True)
            t.add(f"{b}.mlp.fc", f"{h}.ffn.0", True)
            t.add(f"{b}.mlp.proj", f"{h}.ffn.2", True)
        t.add("final_norm", "transformer.layernorm", True)
        return t.head()


RECORDS: tuple[Family, ...] = (XGLM(), CTRL())
