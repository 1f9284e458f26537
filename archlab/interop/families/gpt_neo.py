"""GPT-Neo (``GPTNeoForCausalLM``): GPT-2's pre-norm LayerNorm blocks with separate bias-free q/k/v, unscaled
scores, and layers that attend globally or within a local window (``attention_layers``), as archlab's
``model.layers`` kinds ``local`` and ``global``."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    POSITION_OPTIONS,
    BlockConfig,
    ModelConfig,
    NormConfig,
    embedding_dropout,
)
from archlab.interop.families.base import LAYERS, NO_HEAD_BIAS, Family, Rule, out_bias
from archlab.interop.families.layered import Layer, LayeredFamily
from archlab.interop.families.mlps import plain_activation, plain_mlp
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import dropouts, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mlp import d_ff

WINDOW = 256  # GPTNeoConfig's window_size, written where no layer is local
KINDS = ("global", "local")  # GPT-Neo's attention_layers


class _GPTNeoParts(Family):
    """What every GPT-Neo layer shares: pre-norm LayerNorms with biases, learned positions, q/k/v without
    biases and an output projection with one, scores not scaled by 1/sqrt(head_dim) (``attention.scale``
    1.0), a plain MLP with biases, no head bias. ``resid_dropout`` drops each sublayer's output,
    ``embed_dropout`` the embeddings, ``attention_dropout`` the attention probabilities."""

    model_type, title, model_class, config_class = "gpt_neo", "GPT-Neo", "GPTNeoForCausalLM", "GPTNeoConfig"
    keys = {
        "vocab_size": "vocab_size",
        "max_position_embeddings": "context_length",
        "hidden_size": "d_model",
        "num_layers": "n_layer",
        "num_heads": "attention.n_head",
        "layer_norm_epsilon": "norm.eps",
        "initializer_range": "init_std",
        "tie_word_embeddings": "head.tied",
    }
    prefix = "transformer."
    position_kind = "learned"
    features = frozenset(
        {"model.dropout", "model.embedding_dropout", "model.attention.scale", "model.attention.window"}
    )

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.block.kind", ("pre",), ""),
            ("model.mlp.kind", ("gelu", "relu"), ""),
            ("model.mlp.bias", (True,), ""),
            ("model.attention.qkv_bias", (False,), " (GPT-Neo's q/k/v have no bias)"),
            out_bias(True, " (GPT-Neo's out_proj has a bias)"),
            ("model.attention.scale", (1.0,), " (GPT-Neo does not scale its scores)"),
            *self.mha_rules(cfg),
            NO_HEAD_BIAS,
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            self.keys_to_hf(cfg),
            intermediate_size=d_ff(cfg),
            activation_function=plain_activation(cfg),
            resid_dropout=cfg.dropout,
            embed_dropout=embedding_dropout(cfg),
            attention_dropout=cfg.attention.dropout,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = ModelConfig(
            **dropouts(c.resid_dropout, c.embed_dropout),
            norm=NormConfig(kind="layernorm", bias=True),
            block=BlockConfig(kind="pre"),
            position=POSITION_OPTIONS.make(kind="learned"),
            attention=AttentionConfig(qkv_bias=False, out_bias=True, scale=1.0, dropout=float(c.attention_dropout)),
            mlp=plain_mlp(c, "activation_function", c.intermediate_size or 4 * c.hidden_size),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "transformer.wte")
        t.add("position.table", "transformer.wpe")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"transformer.h.{i}"
            t.add(f"{b}.attn_norm", f"{h}.ln_1", True)
            t.stacked(f"{b}.attn.qkv", [f"{h}.attn.attention.{x}_proj" for x in "qkv"], False, (cfg.d_model,) * 3)
            t.add(f"{b}.attn.proj", f"{h}.attn.attention.out_proj", True)
            t.add(f"{b}.mlp_norm", f"{h}.ln_2", True)
            t.add(f"{b}.mlp.fc", f"{h}.mlp.c_fc", True)
            t.add(f"{b}.mlp.proj", f"{h}.mlp.c_proj", True)
        t.add("final_norm", "transformer.ln_f", True)
        return t.head()


class GPTNeo(LayeredFamily, _GPTNeoParts):
    """GPTNeoForCausalLM: ``_GPTNeoParts`` in every layer, each layer global or local as
    ``attention_layers`` says (the published models alternate them), a local layer seeing itself and the
    ``window_size`` - 1 positions before it (archlab's ``window``); ``attention_types`` is written one entry
    per layer."""

    features = _GPTNeoParts.features | LAYERS
    parts = "GPT-2's blocks, bias-free q/k/v, unscaled scores (`scale` 1.0), local layers' `window` (`model.layers`)"

    def hf_layers(self, c: Any) -> list[Layer]:
        kinds = list(c.attention_layers)
        if len(kinds) != c.num_layers or set(kinds) - set(KINDS):
            refuse_hf(c, "attention_types", f"{c.num_layers} layers, each 'global' or 'local'", c.attention_types)
        if "local" in kinds and (not isinstance(c.window_size, int) or c.window_size < 1):
            refuse_hf(c, "window_size", "a positive integer (the local layers' window)")
        return [Layer(c.window_size if k == "local" else None, POSITION_OPTIONS.make(kind="learned")) for k in kinds]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        return _GPTNeoParts.from_hf(self, c)

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        window = next((lc.attention.window for lc in lcs if lc.attention.window is not None), WINDOW)
        kinds = ["global" if lc.attention.window is None else "local" for lc in lcs]
        return dict(attention_types=[[kinds, 1]], window_size=window)


RECORDS: tuple[Family, ...] = (GPTNeo(),)
