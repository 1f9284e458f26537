"""RecurrentGemma (``RecurrentGemmaForCausalLM``, Griffin; De et al. 2024): pre-norm layers of two (1 + w)
RMSNorms, a temporal block and a tanh-GeGLU MLP with biases (``intermediate_size / 2`` wide), each temporal
block as ``block_types`` cycles: ``recurrent`` (archlab's ``rglru``: linear_y, linear_x, the temporal conv,
the RG-LRU of ``lru_width`` channels gated in ``num_attention_heads`` blocks, linear_out) or ``attention``
(local attention over ``attention_window_size`` keys, MQA/GQA, RoPE on part of each head, half-paired, an
output bias always); embeddings times sqrt(hidden_size) rounded to bfloat16 (its ``normalizer`` buffer: archlab's
``embedding_multiplier``), logits soft-capped (``logits_soft_cap``), the head tied or not.

In archlab the model's own parts are the attention layers' and each layer is of a kind, ``model.layers``:
``recurrent`` (the rglru mixer whole, the model's n_head) and ``attention`` (overriding nothing), in the
shortest ``first`` and ``pattern``. ``w_init_variance_scale`` and the ``final_w_init_variance_scale`` it
derives (2 / num_hidden_layers) set transformers' initialisation only: not read (archlab's rglru and
residual projections initialise their own way).

transformers' recurrent block convolves whatever reaches it: in a left-padded batch the padded positions'
``linear_x`` outputs enter the convolution of the first ``conv1d_width - 1`` tokens after them, so its padded
row differs from the prompt alone; archlab's (zeroed convolution inputs, its RG-LRU reset at each row's first
token, as transformers' at position 0) computes what the prompt alone does."""

from __future__ import annotations

from typing import Any

import torch

from archlab.config import BlockConfig, HeadConfig, ModelConfig, NormConfig, n_kv_head
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig, shortest_layout
from archlab.interop.families.base import (
    NO_HEAD_BIAS,
    Family,
    Problem,
    Rule,
    first_per_field,
    out_bias,
    section_problems,
)
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.rope import rope_fraction, rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, kind_field, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mixers.rglru import width
from archlab.nn.mlp import d_ff

RECURRENT, ATTENTION = "recurrent", "attention"  # transformers' block_types, and archlab's layer kinds
ACTIVATION = "gelu_pytorch_tanh"  # the MLP's and the recurrent block's gate branch's (rglru's tanh GeLU)


def normalizer(d_model: int) -> float:
    """transformers' embedding scale: sqrt(hidden_size) held in a bfloat16 buffer."""
    return float(torch.tensor(d_model**0.5, dtype=torch.bfloat16))


def is_recurrent(lc: ModelConfig) -> bool:
    return lc.attention.kind == "rglru"


def block_types(lcs: list[ModelConfig]) -> list[str]:
    """The shortest cycle of ``recurrent`` and ``attention`` that gives every layer its temporal block."""
    names = [RECURRENT if is_recurrent(lc) else ATTENTION for lc in lcs]
    q = next(q for q in range(1, len(names) + 1) if all(n == names[i % q] for i, n in enumerate(names)))
    return names[:q]


def recurrent_kind(c: Any) -> dict[str, Any]:
    """The ``recurrent`` kind of a config: rglru over ``lru_width`` channels (left out where it is
    hidden_size, the field's default) after a convolution of ``conv1d_width``."""
    kind: dict[str, Any] = {"kind": "rglru", "conv_kernel": c.conv1d_width}
    if c.lru_width != c.hidden_size:
        kind["width"] = c.lru_width
    return kind


class RecurrentGemma(Family):
    """RecurrentGemmaForCausalLM: see the module docstring."""

    mixer_kinds = ("rglru",)

    model_type, title, model_class = "recurrent_gemma", "RecurrentGemma", "RecurrentGemmaForCausalLM"
    config_class = "RecurrentGemmaConfig"
    prefix = "model."
    parts = (
        "RG-LRU recurrent blocks (conv, block-diagonal gates) and local MQA/GQA layers with partial RoPE, "
        "(1 + w) RMSNorms, tanh-GeGLU MLPs with biases, bf16-rounded sqrt(d) embedding scale, logit soft-cap"
    )
    features = frozenset(
        {
            "model.norm.unit_offset",
            "model.scale_embedding",
            "model.embedding_multiplier",
            "model.attention.window",
            "model.head.softcap",
            "model.layers.first",
            "model.layers.pattern",
        }
    )
    keys = {
        **{k: v for k, v in LLAMA_KEYS.items() if k not in ("max_position_embeddings", "initializer_range")},
        "rms_norm_eps": "norm.eps",
        "attention_window_size": "attention.window",
        "logits_soft_cap": "head.softcap",
        "attention_dropout": "attention.dropout",
    }

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        scale = normalizer(cfg.d_model)
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.norm.unit_offset", (True,), " (norm scales are 1 + w)"),
            ("model.block.kind", ("pre",), ""),
            (
                "model.scale_embedding",
                (False,),
                " (its sqrt(hidden_size) is rounded to bfloat16: embedding_multiplier)",
            ),
            ("model.embedding_multiplier", (scale,), f" (sqrt(d_model={cfg.d_model}) rounded to bfloat16)"),
            ("model.position.pairing", ("half",), ""),
            out_bias(True, " (o_proj always has a bias)"),
            ("model.mlp.kind", ("geglu",), f" (hidden_activation {ACTIVATION}, also its recurrent gate branch's)"),
            ("model.mlp.approximate", ("tanh",), f" (hidden_activation {ACTIVATION})"),
            ("model.mlp.bias", (True,), " (its MLP projections always have biases)"),
            NO_HEAD_BIAS,
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems`` of the model's own parts (its attention layers'), a window and a soft-cap (both
        always there), then what its layer kinds set that RecurrentGemma cannot hold: a recurrent layer whose
        sizes differ from the first one's or whose gate blocks are not the model's n_head, an attention layer
        whose attention or RoPE differs from the model's, an MLP that differs (each named as the kind sets it)."""
        found = super().part_problems(cfg)
        if cfg.attention.window is None:
            why = " (its attention layers are local: attention_window_size)"
            found.append(Problem("model.attention.window", None, "a positive integer", why))
        if cfg.head.softcap is None:
            found.append(Problem("model.head.softcap", None, "a positive number", " (logits_soft_cap, always applied)"))
        return found + self.layer_problems(cfg)

    def layer_problems(self, cfg: ModelConfig) -> list[Problem]:
        lcs = layer_configs(cfg)
        first = next((lc.attention for lc in lcs if is_recurrent(lc)), None)
        found: list[Problem] = []
        for i, lc in enumerate(lcs):
            kind = layer_kind(cfg, i)
            if kind is None:
                continue
            if is_recurrent(lc):
                wanted = [("attention", lc.attention, first, "one set of RG-LRU sizes for every recurrent layer")]
                if lc.attention.n_head != cfg.attention.n_head:
                    field = kind_field(cfg, kind, "model.attention.n_head")
                    why = f" ({self.title}'s gate blocks are num_attention_heads)"
                    found.append(Problem(field, lc.attention.n_head, str(cfg.attention.n_head), why))
            else:
                why = "one attention for every attention layer"
                wanted = [("attention", lc.attention, cfg.attention, why)]
            wanted += [
                ("position", lc.position, cfg.position, "one RoPE for every layer"),
                ("mlp", lc.mlp, cfg.mlp, "one MLP for every layer"),
            ]
            found.extend(section_problems(cfg, kind, wanted, self.title))
        return first_per_field(found)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs = layer_configs(cfg)
        recurrent = next((lc for lc in lcs if is_recurrent(lc)), None)
        sizes = (
            {}
            if recurrent is None
            else {"lru_width": width(recurrent), "conv1d_width": recurrent.attention.conv_kernel}
        )
        return dict(
            self.keys_to_hf(cfg),
            intermediate_size=2 * d_ff(cfg),
            num_key_value_heads=n_kv_head(cfg),
            head_dim=head_dim(cfg),
            attention_bias=cfg.attention.qkv_bias,
            hidden_activation=ACTIVATION,
            rope_parameters=rope_to_hf(cfg, rope_fraction(cfg)),
            block_types=block_types(lcs),
            **sizes,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.hidden_activation != ACTIVATION:
            refuse_hf(c, "hidden_activation", f"{ACTIVATION!r} (archlab's rglru gate branch is the tanh GeLU)")
        if c.intermediate_size % 2:
            refuse_hf(c, "intermediate_size", "an even number (the MLP is intermediate_size / 2 wide)")
        types = list(c.block_types)
        if not types or set(types) - {RECURRENT, ATTENTION}:
            refuse_hf(c, "block_types", f"a non-empty list of {RECURRENT!r} and {ATTENTION!r}", types)
        names = [types[i % len(types)] for i in range(c.num_hidden_layers)]
        if RECURRENT in names and c.lru_width % c.num_attention_heads:
            refuse_hf(c, "lru_width", f"a multiple of num_attention_heads={c.num_attention_heads} (the gate blocks)")
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm", unit_offset=True),
            block=BlockConfig(kind="pre"),
            embedding_multiplier=normalizer(c.hidden_size),
            position=rope_from_hf(c, config_head_dim(c), partial=True, scalings=("default",)),
            attention=AttentionConfig(n_kv_head=c.num_key_value_heads, qkv_bias=bool(c.attention_bias), out_bias=True),
            mlp=mlp_section("geglu", approximate="tanh", d_ff=c.intermediate_size // 2, bias=True),
            head=HeadConfig(bias=False),
        )
        cfg = self.keys_from_hf(c, cfg)
        if config_head_dim(c) != c.hidden_size // c.num_attention_heads:
            cfg.attention.head_dim = config_head_dim(c)
        cfg.attention.dropout = float(cfg.attention.dropout)
        cfg.head.softcap = float(c.logits_soft_cap)
        if RECURRENT in names:
            first, pattern = shortest_layout(names)
            kinds: dict[str, Any] = {RECURRENT: {"attention": recurrent_kind(c)}}
            kinds |= {ATTENTION: {}} if ATTENTION in names else {}
            cfg.layers = LayersConfig(kinds=kinds, first=first, pattern=pattern)
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for lc, b, h in t.layers(attn_norm="temporal_pre_norm", mlp_norm="channel_pre_norm"):
            if is_recurrent(lc):
                recurrent_tensors(t, f"{b}.attn", f"{h}.temporal_block")
            else:
                t.qkv(f"{b}.attn.qkv", f"{h}.temporal_block", lc.attention.qkv_bias)
                t.add(f"{b}.attn.proj", f"{h}.temporal_block.o_proj", True)
            t.gate_up(f"{b}.mlp.gate_up", f"{h}.mlp_block", True)
            t.add(f"{b}.mlp.down", f"{h}.mlp_block.down_proj", True)
        t.add("final_norm", "model.final_norm")
        return t.head()


def recurrent_tensors(t: Tensors, archlab: str, hf: str) -> None:
    """The recurrent block's tensors, each as it is: linear_y, linear_x, the depthwise conv_1d (archlab keeps
    nn.Conv1d's [W, 1, K]), the RG-LRU's gates and Λ, linear_out."""
    for name in ("linear_y", "linear_x", "linear_out"):
        t.add(f"{archlab}.{name}", f"{hf}.{name}", True)
    t.maps.append(TensorMap(f"{archlab}.conv_weight", (f"{hf}.conv_1d.weight",)))
    t.maps.append(TensorMap(f"{archlab}.conv_bias", (f"{hf}.conv_1d.bias",)))
    gates = ("input_gate_weight", "input_gate_bias", "recurrent_gate_weight", "recurrent_gate_bias")
    for name in ("recurrent_param", *gates):
        t.maps.append(TensorMap(f"{archlab}.{name}", (f"{hf}.rg_lru.{name}",)))


RECORDS: tuple[Family, ...] = (RecurrentGemma(),)
