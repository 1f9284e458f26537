"""Zamba (``ZambaForCausalLM``, Zyphra's first): pre-norm Mamba-1 layers split into ``n_mamba_heads`` heads
(archlab's ``mamba`` with ``heads``: each head its own x_proj and dt_proj, so its own Δ, B and C), no MLP, and
before the layers of ``layers_block_type`` 'hybrid' a use of one weight-shared transformer block on [hidden,
embeddings] (archlab's ``model.layers.shared`` with one block and no adapters; its MLP gate_proj, up_proj
and down_proj without biases), whose ``linear`` joins the Mamba layer's input before its norm.

Its in_proj holds x and the gate z interleaved row by row (archlab's every x, then every z), and x_proj, dt_proj,
A_log and D one slice per head (archlab's merged); transformers ties the block's copies as Zamba2's, only where it
ties the embeddings. Refused: ``attention_hidden_size`` other than 2·hidden_size or ``attention_head_dim`` other
than 2·hidden_size/num_attention_heads (archlab's shared heads split [hidden, embeddings]), ``hidden_mamba_act``
other than SiLU, attention dropout, an untied head. ``attn_layer_period`` and ``attn_layer_offset`` only
draw the default ``layers_block_type`` (read as it is); ``use_associative_scan`` and ``num_logits_to_keep``
change no logits."""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from archlab.config import POSITION_OPTIONS, BlockConfig, HeadConfig, ModelConfig, NormConfig
from archlab.config.model import LayersConfig, SharedConfig
from archlab.config.shared import shared_d_ff, shared_kv_head
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.interop.families.zamba2 import (
    ACTIVATION_FROM_HF,
    ACTIVATION_TO_HF,
    HYBRID_T,
    MAMBA_T,
    UNTIED_WHY,
    shared_attention_tensors,
    with_tied_copies,
)
from archlab.nn.mixers.mamba import MambaConfig, dt_rank, inner


class Zamba(Family):
    """ZambaForCausalLM: see the module docstring."""

    model_type, title, model_class, config_class = "zamba", "Zamba", "ZambaForCausalLM", "ZambaConfig"
    prefix = "model."
    attention_kind = "mamba"
    position_kind = "none"
    position_why = " (its Mamba layers and its shared attention have no positions)"
    parts = "Mamba-1 layers in heads, one weight-shared attention+MLP block on [hidden, embeddings] before some"
    features = frozenset({"model.layers.shared.layers", "model.attention.heads"})
    keys = {
        "vocab_size": "vocab_size",
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layer",
        "max_position_embeddings": "context_length",
        "initializer_range": "init_std",
        "rms_norm_eps": "norm.eps",
        "tie_word_embeddings": "head.tied",
        "n_mamba_heads": "attention.heads",
        "mamba_d_state": "attention.state_size",
        "mamba_d_conv": "attention.conv_kernel",
        "mamba_conv_bias": "attention.conv_bias",
        "mamba_proj_bias": "attention.bias",
        "time_step_min": "attention.dt_min",
        "time_step_max": "attention.dt_max",
        "time_step_floor": "attention.dt_init_floor",
    }

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        a, d = cfg.attention, cfg.d_model
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre",), ""),
            ("model.mlp.kind", ("none",), " (its Mamba layers have no MLP: the shared block holds one)"),
            NO_HEAD_BIAS,
            ("model.head.tied", (True,), UNTIED_WHY),
            (
                "model.attention.inner",
                (a.inner,) if inner(cfg) % d == 0 else (None,),
                f" (transformers' intermediate width is mamba_expand·hidden_size: a multiple of d_model={d})",
            ),
            ("model.attention.bc_dt_norm", (False,), " (its mixer norms neither B, C nor Δ)"),
            ("model.attention.dt_init", ("random",), " (its dt_proj is drawn uniformly)"),
            ("model.attention.dt_scale", (1.0,), " (its dt_proj is drawn within 1/sqrt(dt_rank))"),
            ("model.layers.shared.blocks", (1,), " (one shared block)"),
            ("model.layers.shared.adapter_rank", (0,), " (its shared block has no adapters)"),
            ("model.layers.shared.mlp_bias", (False,), " (its shared MLP has no biases)"),
            ("model.layers.shared.rope", (False,), " (its shared attention has no positions)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        found = super().part_problems(cfg)
        if not cfg.layers.shared.layers:
            why = " (a Zamba without its shared block is a Mamba model)"
            found.append(Problem("model.layers.shared.layers", [], "at least one layer", why))
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        s, d = cfg.layers.shared, cfg.d_model
        return dict(
            self.keys_to_hf(cfg),
            layers_block_type=[HYBRID_T if i in s.layers else MAMBA_T for i in range(cfg.n_layer)],
            mamba_expand=inner(cfg) // d,
            mamba_dt_rank=dt_rank(cfg),
            hidden_mamba_act="silu",
            num_attention_heads=s.n_head,
            num_key_value_heads=shared_kv_head(cfg),
            attention_hidden_size=2 * d,
            attention_head_dim=2 * d // s.n_head,
            intermediate_size=shared_d_ff(cfg),
            hidden_act=ACTIVATION_TO_HF[s.activation],
            attention_dropout=0.0,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        d, H = c.hidden_size, c.num_attention_heads
        if c.hidden_act not in ACTIVATION_FROM_HF:
            refuse_hf(c, "hidden_act", f"one of {sorted(ACTIVATION_FROM_HF)}")
        if c.hidden_mamba_act != "silu":
            refuse_hf(c, "hidden_mamba_act", "silu (archlab's mamba convolves through SiLU)")
        if not c.tie_word_embeddings:
            refuse_hf(c, "tie_word_embeddings", "true" + UNTIED_WHY)
        if c.attention_hidden_size != 2 * d:
            refuse_hf(
                c, "attention_hidden_size", f"{2 * d} (2·hidden_size: the shared block reads [hidden, embeddings])"
            )
        if c.attention_head_dim != 2 * d // H:
            refuse_hf(c, "attention_head_dim", f"{2 * d // H} (2·hidden_size/num_attention_heads)")
        if c.attention_dropout:
            refuse_hf(c, "attention_dropout", "0.0 (archlab's shared attention has no dropout)")
        types = list(c.layers_block_type)
        if any(t not in (MAMBA_T, HYBRID_T) for t in types):
            refuse_hf(c, "layers_block_type", f"'{MAMBA_T}' and '{HYBRID_T}' layers", types)
        hybrid = [i for i, t in enumerate(types) if t == HYBRID_T]
        rank, width = int(c.mamba_dt_rank), c.mamba_expand * d
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="pre"),
            position=POSITION_OPTIONS.make(kind="none"),
            attention=MambaConfig(
                inner=None if width == 2 * d else width, dt_rank=None if rank == math.ceil(d / 16) else rank
            ),
            mlp=mlp_section("none"),
            head=HeadConfig(bias=False),
        )
        cfg = self.keys_from_hf(c, cfg)
        kv = c.num_key_value_heads
        cfg.layers = LayersConfig(
            shared=SharedConfig(
                layers=hybrid,
                n_head=H,
                n_kv_head=None if kv in (None, H) else kv,
                d_ff=c.intermediate_size,
                activation=ACTIVATION_FROM_HF[c.hidden_act],
            )
        )
        return cfg

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        return with_tied_copies(cfg, state, "shared_transf")

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        a, s = cfg.attention, cfg.layers.shared
        H, width, R, N = a.heads, inner(cfg), dt_rank(cfg), a.state_size
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        use = {layer: u for u, layer in enumerate(s.layers)}
        for i in range(cfg.n_layer):
            h = f"model.layers.{i}" + (".mamba_decoder" if i in use else "")
            ours, theirs = f"blocks.{i}.attn", f"{h}.mamba"
            t.add(f"blocks.{i}.attn_norm", f"{h}.input_layernorm")
            t.add(f"{ours}.in_proj", f"{theirs}.in_proj", a.bias, "halves_interleaved")
            t.maps.append(TensorMap(f"{ours}.conv_weight", (f"{theirs}.conv1d.weight",)))
            if a.conv_bias:
                t.maps.append(TensorMap(f"{ours}.conv_bias", (f"{theirs}.conv1d.bias",)))
            per_head = [
                ("x_proj.weight", "x_proj_weight", (H, R + 2 * N, width // H)),
                ("dt_proj.weight", "dt_proj_weight", (H, width // H, R)),
                ("dt_proj.bias", "dt_proj_bias", (H, width // H)),
                ("A_log", "A_log", (H, width // H, N)),
                ("D", "D", (H, width // H)),
            ]
            for name, hf, sizes in per_head:
                t.maps.append(TensorMap(f"{ours}.{name}", (f"{theirs}.{hf}",), "heads_merged", sizes))
            t.add(f"{ours}.out_proj", f"{theirs}.out_proj", a.bias)
            if i in use:
                t.add(f"shared.uses.{use[i]}.out", f"model.layers.{i}.linear")
        for layer in s.layers:  # every use's copy of the one block
            theirs = f"model.layers.{layer}.shared_transf"
            shared_attention_tensors(t, "shared.blocks.0", theirs)
            f = shared_d_ff(cfg)
            t.stacked(
                "shared.blocks.0.gate_up", [f"{theirs}.feed_forward.{n}_proj" for n in ("gate", "up")], False, (f, f)
            )
            t.add("shared.blocks.0.down", f"{theirs}.feed_forward.down_proj")
        t.add("final_norm", "model.final_layernorm")
        return t.head()


RECORDS: tuple[Family, ...] = (Zamba(),)
