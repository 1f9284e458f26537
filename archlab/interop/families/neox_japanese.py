"""GPT-NeoX Japanese (``GPTNeoXJapaneseForCausalLM``): GPT-NeoX's per-head fused q/k/v and partial RoPE in
pre-norm LayerNorm blocks without biases, but for the last layer's attention output (``dense_bias``): a
layer layout whose last layer alone has ``attention.out_bias`` (``model.layers``)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import BlockConfig, LayersConfig, ModelConfig, NormConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule, bare, first_per_field
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import plain_activation, plain_mlp
from archlab.interop.families.rope import rope_fraction, rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import differences, kind_field
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff

HEAD = "embed_out.weight"  # the head's name, outside the base model
UNBIASED = "no_out_bias"  # the layer kind of every layer but the last: the model's attention less its output bias


def last_layer_biased(n_layer: int) -> LayersConfig:
    """The layout whose last layer alone keeps the model's ``out_bias``: every other layer of kind ``UNBIASED``."""
    if n_layer == 1:
        return LayersConfig()
    return LayersConfig(kinds={UNBIASED: {"attention": {"out_bias": False}}}, first=[UNBIASED] * (n_layer - 1))


class GPTNeoXJapanese(Family):
    """GPTNeoXJapaneseForCausalLM: pre-norm LayerNorms (``layer_norm_eps``), one per-head fused
    ``query_key_value`` and a ``dense`` output without biases, the last layer's attention output biased
    (``dense_bias``), partial half-paired RoPE, an MLP of ``hidden_size × intermediate_multiple_size``
    without biases, a head ``embed_out`` without bias. ``hidden_dropout`` drops each sublayer's output,
    ``attention_dropout`` the attention probabilities; the embeddings are not dropped."""

    model_type, title = "gpt_neox_japanese", "GPT-NeoX Japanese"
    model_class, config_class = "GPTNeoXJapaneseForCausalLM", "GPTNeoXJapaneseConfig"
    prefix = "gpt_neox_japanese."
    keys = {**LLAMA_KEYS, "layer_norm_eps": "norm.eps"}
    features = frozenset({"model.dropout", "model.position.scaling.kind", "model.layers.first", "model.layers.pattern"})
    parts = "pre-norm LayerNorm, per-head fused q/k/v, partial RoPE, no biases but the last layer's attention output"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.block.kind", ("pre",), ""),
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.kind", ("gelu", "relu"), ""),
            ("model.mlp.bias", (False,), ""),
            ("model.attention.qkv_bias", (False,), ""),
            *self.mha_rules(cfg),
            NO_HEAD_BIAS,
            ("model.embedding_dropout", (None,), " (hidden_dropout drops no embeddings)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """The model's rules, then each layer's: its attention output biased on the last layer alone, and
        nothing else differing from the model's parts."""
        found = super().part_problems(cfg)
        if cfg.mlp.kind in ("gelu", "relu") and d_ff(cfg) % cfg.d_model:  # another kind: refused by its rule
            found.append(Problem("model.mlp.d_ff", d_ff(cfg), f"a multiple of d_model={cfg.d_model}"))
        for i, lc in enumerate(layer_configs(cfg)):
            kind, last = layer_kind(cfg, i), i == cfg.n_layer - 1
            if lc.attention.out_bias != last:
                why = f" ({self.title} biases the last layer's attention output alone)"
                field = kind_field(cfg, kind, "model.attention.out_bias")
                found.append(Problem(field, lc.attention.out_bias, bare(last), why, (last,)))
            for section in ("attention", "position", "mlp", "block"):
                for name, value, want in differences(getattr(lc, section), getattr(cfg, section)):
                    if (section, name) != ("attention", "out_bias"):
                        field = kind_field(cfg, kind, f"model.{section}.{name}")
                        why = f" ({self.title}'s layers differ in the attention output bias alone)"
                        found.append(Problem(field, value, bare(want), why, (want,)))
        return first_per_field(found)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            self.keys_to_hf(cfg),
            intermediate_multiple_size=d_ff(cfg) // cfg.d_model,
            hidden_act=plain_activation(cfg),
            attention_dropout=cfg.attention.dropout,
            hidden_dropout=cfg.dropout,
            rope_parameters=rope_to_hf(cfg, rope_fraction(cfg)),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        mlp = plain_mlp(c, "hidden_act", c.hidden_size * c.intermediate_multiple_size)
        mlp.bias = False
        cfg = ModelConfig(
            dropout=float(c.hidden_dropout),
            norm=NormConfig(kind="layernorm", bias=True),
            block=BlockConfig(kind="pre"),
            position=rope_from_hf(c, c.hidden_size // c.num_attention_heads, partial=True),
            attention=AttentionConfig(qkv_bias=False, out_bias=True, dropout=float(c.attention_dropout)),
            mlp=mlp,
            layers=last_layer_biased(c.num_hidden_layers),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, d = Tensors(cfg), "gpt_neox_japanese"
        t.add("tok_emb", f"{d}.embed_in")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"{d}.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm", True)
            t.add(f"{b}.mlp_norm", f"{h}.post_attention_layernorm", True)
            qkv_sizes = (cfg.attention.n_head, head_dim(cfg))
            t.add(f"{b}.attn.qkv", f"{h}.attention.query_key_value", False, "heads_interleaved", qkv_sizes)
            t.add(f"{b}.attn.proj", f"{h}.attention.dense")
            if i == cfg.n_layer - 1:  # the bias beside the Linear, under a name of its own
                t.maps.append(TensorMap(f"{b}.attn.proj.bias", (f"{h}.attention.dense_bias",)))
            t.add(f"{b}.mlp.fc", f"{h}.mlp.dense_h_to_4h")
            t.add(f"{b}.mlp.proj", f"{h}.mlp.dense_4h_to_h")
        t.add("final_norm", f"{d}.final_layer_norm", True)
        # the head under its own name, tied or not: a tied model's state holds it as the embedding (BioGPT's way)
        return [*t.maps, TensorMap("head.weight", (HEAD,))]

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """A tied checkpoint saves the embedding alone: its head is that tensor."""
        if cfg.head.tied and HEAD not in state:
            return {**state, HEAD: state[f"{self.prefix}embed_in.weight"]}
        return state


RECORDS: tuple[Family, ...] = (GPTNeoXJapanese(),)
