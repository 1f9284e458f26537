"""ModernBERT's decoder (``modernbert-decoder``): pre-norm LayerNorm layers over normed embeddings, the first
layer with no attention norm (``model.block.attn_norm: false`` by layer kind), local and global layers with
RoPE per layer type, a GeGLU MLP, and a dense + activation + LayerNorm prediction head before the decoder
matrix (``model.head.kind: transform``)."""

from __future__ import annotations

import copy
from typing import Any

from archlab.config import BlockConfig, HeadConfig, ModelConfig, NormConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig, shortest_layout
from archlab.interop.families.base import LAYERS, Family, Problem, Rule
from archlab.interop.families.layered import Layer, LayeredFamily, per_type_rope, rope_per_type_to_hf
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.interop.families.windows import SLIDING, checked_types, layer_types, sliding_window
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mlp import d_ff

ATTN_NORM = "model.block.attn_norm"
# the head's activation: transformers' ACT2FN name by archlab's transform_activation
HEAD_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu", "silu": "silu"}
MLP_ACTIVATIONS = {"gelu": "none", "gelu_pytorch_tanh": "tanh"}  # hidden_activation -> geglu's approximate
DROPOUTS = ("attention_dropout", "embedding_dropout", "mlp_dropout")
# its config class takes ints (None refused) for these ids; archlab holds no special tokens: row 0 for each
_TOKEN_IDS = dict.fromkeys(("pad_token_id", "bos_token_id", "cls_token_id", "sep_token_id"), 0)


class ModernBertDecoder(LayeredFamily):
    """ModernBertDecoderForCausalLM: token embeddings LayerNormed (``embeddings.norm``), pre-norm LayerNorm
    blocks (eps ``norm_eps``, shifts by ``norm_bias``) whose layer 0 has no ``attn_norm`` (an Identity),
    multi-head attention (q/k/v and ``Wo`` biases by ``attention_bias``) sliding over ``local_attention // 2``
    on the layers ``layer_types`` marks, RoPE of its own theta per layer type, a GeGLU MLP (``Wi`` holds the
    activated half first, biases by ``mlp_bias``), the final norm, then ``lm_head`` (dense, its bias by
    ``classifier_bias``, ``classifier_activation``, LayerNorm) and the ``decoder`` matrix, tied or not, its
    bias by ``decoder_bias``."""

    model_type, title, model_class, config_class = (
        "modernbert-decoder",
        "ModernBERT decoder",
        "ModernBertDecoderForCausalLM",
        "ModernBertDecoderConfig",
    )
    parts = (
        "pre-norm LayerNorm over normed embeddings, no attention norm in layer 0, local/global layers with RoPE "
        "per layer type, GeGLU, a transform head"
    )
    keys = {
        "vocab_size": "vocab_size",
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "attention.n_head",
        "max_position_embeddings": "context_length",
        "initializer_range": "init_std",
        "tie_word_embeddings": "head.tied",
        "norm_eps": "norm.eps",
        "norm_bias": "norm.bias",
        "decoder_bias": "head.bias",
        "classifier_bias": "head.transform_bias",
    }
    prefix = "model."
    features = frozenset({"model.embedding_norm", ATTN_NORM, "model.attention.window", *LAYERS})
    scalings = ("none",)
    head_kinds = ("transform",)
    block_kinds = True  # layer 0's kind sets block.attn_norm; layer_problems checks which layers do
    rope_per_type = True
    tied_head = "decoder.weight"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        a = cfg.attention
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.block.kind", ("pre",), ""),
            ("model.embedding_norm", (True,), " (its embeddings are LayerNormed)"),
            ("model.mlp.kind", ("geglu",), " (its MLP is a GeGLU, Wi's halves)"),
            ("model.mlp.approximate", ("none", "tanh"), ""),
            ("model.attention.out_bias", (a.qkv_bias,), " (one attention_bias flag sets q/k/v and Wo)"),
            *self.mha_rules(cfg),
        ]

    def layer_problems(self, lcs: list[ModelConfig]) -> list[tuple[int, Problem]]:
        """Layer 0 without its attention norm, every other layer with it."""
        for i, lc in enumerate(lcs):
            if lc.block.attn_norm != (i > 0):
                why = " (its layer 0 alone reads the normed embeddings without an attention norm)"
                return [(i, Problem(ATTN_NORM, lc.block.attn_norm, str(i > 0).lower(), why, (i > 0,)))]
        return []

    # ---- Hugging Face -> archlab

    def hf_layers(self, c: Any) -> list[Layer]:
        types = checked_types(c)
        ropes = per_type_rope(c, types, c.hidden_size // c.num_attention_heads)
        return [Layer(c.sliding_window if t == SLIDING else None, ropes[t]) for t in types]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        for key in DROPOUTS:
            if getattr(c, key):
                refuse_hf(c, key, "0 (archlab's dropout is one rate for the whole model)")
        if c.hidden_activation not in MLP_ACTIVATIONS:
            refuse_hf(c, "hidden_activation", " or ".join(repr(a) for a in MLP_ACTIVATIONS))
        activations = {hf: ours for ours, hf in HEAD_ACTIVATIONS.items()}
        if c.classifier_activation not in activations:
            refuse_hf(c, "classifier_activation", " or ".join(repr(a) for a in activations))
        cfg = ModelConfig(
            dropout=0.0,
            embedding_norm=True,
            norm=NormConfig(kind="layernorm"),
            block=BlockConfig(kind="pre"),
            attention=AttentionConfig(qkv_bias=bool(c.attention_bias), out_bias=bool(c.attention_bias)),
            mlp=mlp_section(
                "geglu",
                approximate=MLP_ACTIVATIONS[c.hidden_activation],
                bias=bool(c.mlp_bias),
                d_ff=c.intermediate_size,
            ),
            head=HeadConfig(kind="transform", transform_activation=activations[c.classifier_activation]),
        )
        return self.keys_from_hf(c, cfg)

    def from_hf(self, c: Any) -> ModelConfig:
        return _first_layer_bare(super().from_hf(c))

    # ---- archlab -> Hugging Face

    def uniform_to_hf(self, rep: ModelConfig) -> dict[str, Any]:
        return dict(
            self.keys_to_hf(rep),
            intermediate_size=d_ff(rep),
            attention_bias=rep.attention.qkv_bias,
            mlp_bias=rep.mlp.bias,
            hidden_activation={"none": "gelu", "tanh": "gelu_pytorch_tanh"}[rep.mlp.approximate],
            classifier_activation=HEAD_ACTIVATIONS[rep.head.transform_activation],
            **dict.fromkeys(DROPOUTS, 0.0),
            **_TOKEN_IDS,
        )

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        return dict(
            layer_types=layer_types(lcs),
            local_attention=2 * sliding_window(cfg, lcs),  # transformers slides over local_attention // 2
            rope_parameters=rope_per_type_to_hf(lcs),
        )

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        norm_bias = cfg.norm.bias
        t.add("tok_emb", "model.embeddings.tok_embeddings")
        t.add("embedding_norm", "model.embeddings.norm", norm_bias)
        for i, lc in enumerate(layer_configs(cfg)):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            if lc.block.attn_norm:
                t.add(f"{b}.attn_norm", f"{h}.attn_norm", norm_bias)
            t.qkv(f"{b}.attn.qkv", f"{h}.attn", lc.attention.qkv_bias)
            t.add(f"{b}.attn.proj", f"{h}.attn.Wo", lc.attention.out_bias)
            t.add(f"{b}.mlp_norm", f"{h}.mlp_norm", norm_bias)
            t.add(f"{b}.mlp.gate_up", f"{h}.mlp.Wi", lc.mlp.bias)
            t.add(f"{b}.mlp.down", f"{h}.mlp.Wo", lc.mlp.bias)
        t.add("final_norm", "model.final_norm", norm_bias)
        t.add("head.dense", "lm_head.dense", cfg.head.transform_bias)
        t.add("head.transform_norm", "lm_head.norm", norm_bias)
        if not cfg.head.tied:
            t.maps.append(TensorMap("head.weight", ("decoder.weight",)))
        if cfg.head.bias:
            t.maps.append(TensorMap("head.bias", ("decoder.bias",)))
        return t.maps


def _first_layer_bare(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with layer 0 of a kind of its own that adds ``block.attn_norm: false`` to its kind's overrides."""
    names = [layer_kind(cfg, i) for i in range(cfg.n_layer)]
    kinds = copy.deepcopy(dict(cfg.layers.kinds or {}))
    first = f"{names[0]}_bare" if names[0] else "bare"
    kinds[first] = {**kinds.get(names[0] or "", {}), "block": {"attn_norm": False}}
    names[0] = first
    kinds = {name: overrides for name, overrides in kinds.items() if name in names}  # layer 0's own may go
    if None in names[1:]:  # the other layers the model's own parts: layer 0's kind alone
        cfg.layers = LayersConfig(kinds=kinds, first=[first], pattern=[])
        return cfg
    head, pattern = shortest_layout([n or "" for n in names])
    cfg.layers = LayersConfig(kinds=kinds, first=head, pattern=pattern)
    return cfg


RECORDS: tuple[Family, ...] = (ModernBertDecoder(),)
