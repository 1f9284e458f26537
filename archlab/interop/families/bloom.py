"""BLOOM (``BloomForCausalLM``): ALiBi, a LayerNorm on the token embeddings, a fused q/k/v laid out per
head, a tanh-GELU MLP of 4·d_model, biases everywhere."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    POSITION_OPTIONS,
    BlockConfig,
    ModelConfig,
    NormConfig,
)
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule, fmt, no_embedding_dropout, out_bias
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import dropouts, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff

CONTEXT = 2048  # BLOOM's training length: the context_length of a config that states none (ALiBi has no limit)


class Bloom(Family):
    """BloomForCausalLM: pre-norm LayerNorm blocks after a LayerNorm on the token embeddings
    (``word_embeddings_layernorm``: ``model.embedding_norm``), ALiBi with Press et al.'s slopes, one fused
    ``query_key_value`` holding [q_h, k_h, v_h] per head h (as GPT-NeoX's), an MLP of 4·d_model with
    BLOOM's tanh GELU, biases on every Linear, no head bias. ``hidden_dropout`` drops the attention's and
    the MLP's outputs before each residual add, not the embeddings: ``model.dropout`` with
    ``model.embedding_dropout`` 0.0; ``attention_dropout`` drops the attention probabilities. ``pretraining_tp`` and ``slow_but_exact`` only split the output projections' sums into
    slices (the same function up to rounding): accepted, not read. BLOOM's config has no context length:
    ``seq_length`` where a config has it, else 2048, its training length."""

    model_type, title, model_class, config_class = "bloom", "BLOOM", "BloomForCausalLM", "BloomConfig"
    keys = {
        "vocab_size": "vocab_size",
        "hidden_size": "d_model",
        "n_layer": "n_layer",
        "n_head": "attention.n_head",
        "layer_norm_epsilon": "norm.eps",
        "initializer_range": "init_std",
        "tie_word_embeddings": "head.tied",
    }
    prefix = "transformer."
    features = frozenset({"model.dropout", "model.embedding_dropout", "model.embedding_norm"})
    position_kind = "alibi"
    parts = "LayerNorm on the embeddings, pre-norm LayerNorm, ALiBi, per-head fused q/k/v, tanh-GELU MLP, biases"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.embedding_norm", (True,), " (word_embeddings_layernorm)"),
            ("model.block.kind", ("pre",), ""),
            ("model.mlp.kind", ("gelu",), ""),
            ("model.mlp.approximate", ("tanh",), " (BLOOM's GELU is the tanh approximation)"),
            ("model.mlp.bias", (True,), ""),
            ("model.attention.qkv_bias", (True,), ""),
            out_bias(True),
            *self.mha_rules(cfg),
            NO_HEAD_BIAS,
            no_embedding_dropout(cfg, self.title),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        found = super().part_problems(cfg)
        if cfg.mlp.kind != "none" and d_ff(cfg) != 4 * cfg.d_model:  # none: refused for its kind
            found.append(Problem("model.mlp.d_ff", d_ff(cfg), f"{4 * cfg.d_model}", " (BLOOM's MLP is 4·d_model wide)"))
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            self.keys_to_hf(cfg),
            apply_residual_connection_post_layernorm=False,
            hidden_dropout=cfg.dropout,
            attention_dropout=cfg.attention.dropout,
            seq_length=cfg.context_length,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.apply_residual_connection_post_layernorm:
            refuse_hf(
                c,
                "apply_residual_connection_post_layernorm",
                f"{fmt(False)} (archlab's residual stream carries each block's input, not its normed copy)",
            )
        cfg = ModelConfig(
            context_length=getattr(c, "seq_length", None) or CONTEXT,
            **dropouts(c.hidden_dropout, 0.0),
            embedding_norm=True,
            norm=NormConfig(kind="layernorm", bias=True),
            block=BlockConfig(kind="pre"),
            position=POSITION_OPTIONS.make(kind="alibi"),
            attention=AttentionConfig(dropout=float(c.attention_dropout)),
            mlp=mlp_section("gelu", d_ff=4 * c.hidden_size, bias=True, approximate="tanh"),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, H = Tensors(cfg), cfg.attention.n_head
        t.add("tok_emb", "transformer.word_embeddings")
        t.add("embedding_norm", "transformer.word_embeddings_layernorm", True)
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"transformer.h.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm", True)
            t.add(f"{b}.attn.qkv", f"{h}.self_attention.query_key_value", True, "heads_interleaved", (H, head_dim(cfg)))
            t.add(f"{b}.attn.proj", f"{h}.self_attention.dense", True)
            t.add(f"{b}.mlp_norm", f"{h}.post_attention_layernorm", True)
            t.add(f"{b}.mlp.fc", f"{h}.mlp.dense_h_to_4h", True)
            t.add(f"{b}.mlp.proj", f"{h}.mlp.dense_4h_to_h", True)
        t.add("final_norm", "transformer.ln_f", True)
        return t.head()


RECORDS: tuple[Family, ...] = (Bloom(),)
