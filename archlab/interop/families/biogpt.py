"""BioGPT (``BioGptForCausalLM``): pre-norm LayerNorm blocks, token embeddings scaled by √d_model, OPT's learned
positions (two leading rows no token reads), q/k/v and MLP Linears with biases, a tied head."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import (
    POSITION_OPTIONS,
    BlockConfig,
    ModelConfig,
    NormConfig,
    embedding_dropout,
)
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Rule, fmt, out_bias
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import plain_activation, plain_mlp
from archlab.interop.families.opt import EPS, OFFSET
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import dropouts, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mlp import d_ff

HEAD = "output_projection.weight"  # BioGPT's head, tied to the embedding as published


class BioGpt(Family):
    """BioGptForCausalLM: pre-norm LayerNorms of eps 1e-5 (torch's default: transformers' BioGPT does not
    read ``layer_norm_eps``), token embeddings times √d_model where ``scale_embedding``
    (``model.scale_embedding``), OPT's position table (position p at row p + 2), separate q/k/v, output and
    MLP Linears with biases, no head bias; the head ``output_projection``, tied or not. ``hidden_dropout_prob``
    drops the embeddings and each sublayer's output, ``attention_probs_dropout_prob`` the attention
    probabilities; ``activation_dropout`` (inside the MLP) and ``layerdrop`` are refused unless 0."""

    model_type, title, model_class, config_class = "biogpt", "BioGPT", "BioGptForCausalLM", "BioGptConfig"
    keys = LLAMA_KEYS  # its layer_norm_eps is written, read as 1e-5
    prefix = "biogpt."
    features = frozenset({"model.dropout", "model.embedding_dropout", "model.scale_embedding"})
    position_kind = "learned"
    position_why = " (BioGPT's table)"
    parts = "pre-norm LayerNorm, √d_model embedding scale, learned positions (offset 2), GELU MLP, biases"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.norm.eps", (EPS,), " (BioGPT's LayerNorms use torch's default)"),
            ("model.block.kind", ("pre",), ""),
            ("model.mlp.kind", ("gelu", "relu"), ""),
            ("model.mlp.bias", (True,), ""),
            ("model.attention.qkv_bias", (True,), ""),
            out_bias(True),
            *self.mha_rules(cfg),
            NO_HEAD_BIAS,
            ("model.embedding_dropout", (None,), " (hidden_dropout_prob drops the embeddings too)"),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            self.keys_to_hf(cfg),
            intermediate_size=d_ff(cfg),
            hidden_act=plain_activation(cfg),
            hidden_dropout_prob=embedding_dropout(cfg),
            attention_probs_dropout_prob=cfg.attention.dropout,
            layer_norm_eps=cfg.norm.eps,
            scale_embedding=cfg.scale_embedding,
            layerdrop=0.0,
            activation_dropout=0.0,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        for name in ("layerdrop", "activation_dropout"):
            if getattr(c, name) != 0:
                refuse_hf(c, name, f"{fmt(0.0)} (archlab runs every layer and drops no MLP activations)")
        cfg = ModelConfig(
            **dropouts(c.hidden_dropout_prob, c.hidden_dropout_prob),
            scale_embedding=bool(c.scale_embedding),
            norm=NormConfig(kind="layernorm", eps=EPS, bias=True),
            block=BlockConfig(kind="pre"),
            position=POSITION_OPTIONS.make(kind="learned"),
            attention=AttentionConfig(dropout=float(c.attention_probs_dropout_prob)),
            mlp=plain_mlp(c, "hidden_act", c.intermediate_size),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, d = Tensors(cfg), "biogpt"
        t.add("tok_emb", f"{d}.embed_tokens")
        t.add("position.table", f"{d}.embed_positions", layout="offset_rows", sizes=(OFFSET,))
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"{d}.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.self_attn_layer_norm", True)
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", True)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.out_proj", True)
            t.add(f"{b}.mlp_norm", f"{h}.final_layer_norm", True)
            t.add(f"{b}.mlp.fc", f"{h}.fc1", True)
            t.add(f"{b}.mlp.proj", f"{h}.fc2", True)
        t.add("final_norm", f"{d}.layer_norm", True)
        # the head under BioGPT's name, tied or not: a tied model's state holds it as the embedding
        return [*t.maps, TensorMap("head.weight", (HEAD,))]

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """A tied checkpoint saves the embedding alone: its head is that tensor."""
        if cfg.head.tied and HEAD not in state:
            return {**state, HEAD: state[f"{self.prefix}embed_tokens.weight"]}
        return state


RECORDS: tuple[Family, ...] = (BioGpt(),)
