"""GPT-2 and GPT-J: LayerNorm with biases, a two-matrix MLP with biases, one config vocabulary."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    POSITION_OPTIONS,
    BlockConfig,
    ModelConfig,
    NormConfig,
    embedding_dropout,
)
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Rule, fmt, out_bias
from archlab.interop.families.mlps import plain_activation, plain_mlp
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import dropouts, refuse_hf
from archlab.nn.mlp import d_ff
from archlab.nn.rope import rotary_dim

# ---- GPT-2 and GPT-J

# GPT-2's config keys, shared by its relatives and copied as they are (``Family.keys``).
GPT_KEYS = {
    "vocab_size": "vocab_size",
    "n_positions": "context_length",
    "n_embd": "d_model",
    "n_layer": "n_layer",
    "n_head": "attention.n_head",
    "layer_norm_epsilon": "norm.eps",
    "initializer_range": "init_std",
    "tie_word_embeddings": "head.tied",
}


class _GPT(Family):
    """GPT-2 and GPT-J share LayerNorm with a bias, a two-matrix MLP with biases and their config names."""

    prefix = "transformer."
    features = frozenset({"model.dropout", "model.embedding_dropout"})
    keys = {**GPT_KEYS, "attn_pdrop": "attention.dropout"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.mlp.kind", ("gelu", "relu"), ""),
            ("model.mlp.bias", (True,), ""),
            *self.mha_rules(cfg),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            self.keys_to_hf(cfg),
            n_inner=d_ff(cfg),
            activation_function=plain_activation(cfg),
            resid_pdrop=cfg.dropout,
            embd_pdrop=embedding_dropout(cfg),
        )

    def base_config(self, c: Any) -> ModelConfig:
        cfg = ModelConfig(
            **dropouts(c.resid_pdrop, c.embd_pdrop),
            norm=NormConfig(kind="layernorm", bias=True),
            mlp=plain_mlp(c, "activation_function", c.n_inner or 4 * c.n_embd),
        )
        return self.keys_from_hf(c, cfg)


class GPT2(_GPT):
    """GPT2LMHeadModel: pre-norm, learned positions, Conv1D layers (biases everywhere), no head bias."""

    parts = "pre-norm LayerNorm, learned positions, GELU/ReLU MLP, biases everywhere"

    model_type, title, model_class, config_class = "gpt2", "GPT-2", "GPT2LMHeadModel", "GPT2Config"
    position_kind = "learned"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            ("model.block.kind", ("pre",), ""),
            ("model.attention.qkv_bias", (True,), " (Conv1D layers always have a bias)"),
            out_bias(True, " (Conv1D layers always have a bias)"),
            NO_HEAD_BIAS,
        ]

    def from_hf(self, c: Any) -> ModelConfig:
        for name, want in (
            ("add_cross_attention", False),
            ("scale_attn_weights", True),
            ("scale_attn_by_inverse_layer_idx", False),
        ):
            if getattr(c, name, want) != want:
                refuse_hf(
                    c, name, f"{fmt(want)} (archlab attention is causal self-attention scaled by 1/sqrt(head_dim))"
                )
        cfg = self.base_config(c)
        cfg.block, cfg.position = BlockConfig(kind="pre"), POSITION_OPTIONS.make(kind="learned")
        cfg.head.bias = False
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "transformer.wte")
        t.add("position.table", "transformer.wpe")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"transformer.h.{i}"
            t.add(f"{b}.attn_norm", f"{h}.ln_1", True)
            t.add(f"{b}.attn.qkv", f"{h}.attn.c_attn", True, "transposed")  # [Q | K | V] in both
            t.add(f"{b}.attn.proj", f"{h}.attn.c_proj", True, "transposed")
            t.add(f"{b}.mlp_norm", f"{h}.ln_2", True)
            t.add(f"{b}.mlp.fc", f"{h}.mlp.c_fc", True, "transposed")
            t.add(f"{b}.mlp.proj", f"{h}.mlp.c_proj", True, "transposed")
        t.add("final_norm", "transformer.ln_f", True)
        return t.head()


class GPTJ(_GPT):
    """GPTJForCausalLM: parallel block with one shared LayerNorm, interleaved RoPE (base 1e4), no
    attention biases, a head bias."""

    parts = "parallel block, one shared LayerNorm, interleaved partial RoPE, plain MLP, head bias"

    model_type, title, model_class, config_class = "gptj", "GPT-J", "GPTJForCausalLM", "GPTJConfig"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            ("model.block.kind", ("parallel",), ""),
            ("model.block.shared_norm", (True,), " (one ln_1 feeds attention and MLP)"),
            ("model.position.pairing", ("interleaved",), ""),
            ("model.position.theta", (10000.0,), " (GPT-J's rotary base is fixed)"),
            ("model.attention.qkv_bias", (False,), ""),
            out_bias(False),
            ("model.head.bias", (True,), ""),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), rotary_dim=rotary_dim(cfg))

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = self.base_config(c)
        cfg.block = BlockConfig(kind="parallel", shared_norm=True)
        cfg.position = POSITION_OPTIONS.make(kind="rope", theta=10000.0, rotary_dim=c.rotary_dim, pairing="interleaved")
        cfg.attention.qkv_bias = cfg.attention.out_bias = False
        cfg.head.bias = True
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "transformer.wte")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"transformer.h.{i}"
            t.add(f"{b}.attn_norm", f"{h}.ln_1", True)
            t.qkv(f"{b}.attn.qkv", f"{h}.attn", False)
            t.add(f"{b}.attn.proj", f"{h}.attn.out_proj")
            t.add(f"{b}.mlp.fc", f"{h}.mlp.fc_in", True)
            t.add(f"{b}.mlp.proj", f"{h}.mlp.fc_out", True)
        t.add("final_norm", "transformer.ln_f", True)
        return t.head()


RECORDS: tuple[Family, ...] = (GPT2(), GPTJ())
