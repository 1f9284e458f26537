"""Mamba-2 (Mamba2ForCausalLM): every block an RMSNorm and a Mamba-2 mixer (``attention.kind: mamba2``), no
MLP, no positions."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from archlab.config import POSITION_OPTIONS, HeadConfig, ModelConfig, NormConfig
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Rule, out_bias
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.mamba2 import Mamba2Config, head_dim, inner

# the keys MambaConfig and Mamba2Config share, and the fields they read into
BACKBONE_KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layer",
    "layer_norm_epsilon": "norm.eps",
    "initializer_range": "init_std",
    "state_size": "attention.state_size",
    "conv_kernel": "attention.conv_kernel",
    "use_conv_bias": "attention.conv_bias",
    "time_step_min": "attention.dt_min",
    "time_step_max": "attention.dt_max",
    "time_step_floor": "attention.dt_init_floor",
    "tie_word_embeddings": "head.tied",
}


def backbone_tensors(cfg: ModelConfig, mixer: Callable[[Tensors, str, str], None]) -> list[TensorMap]:
    """The tensors of a Mamba backbone as transformers names them (Mamba and Mamba-2 alike): the embeddings,
    each block's norm, its convolution and what ``mixer(t, ours, theirs)`` maps of the rest of its mixer
    (archlab's and HF's prefixes), the final norm, the head."""
    t, a = Tensors(cfg), cfg.attention
    t.add("tok_emb", "backbone.embeddings")
    for i in range(cfg.n_layer):
        ours, theirs = f"blocks.{i}.attn", f"backbone.layers.{i}.mixer"
        t.add(f"blocks.{i}.attn_norm", f"backbone.layers.{i}.norm")
        t.maps.append(TensorMap(f"{ours}.conv_weight", (f"{theirs}.conv1d.weight",)))
        if a.conv_bias:
            t.maps.append(TensorMap(f"{ours}.conv_bias", (f"{theirs}.conv1d.bias",)))
        mixer(t, ours, theirs)
    t.add("final_norm", "backbone.norm_f")
    return t.head()


class Mamba2(Family):
    """Mamba2ForCausalLM (Mamba-Codestral, state-spaces/mamba2-*): pre-norm blocks of an RMSNorm and
    ``Mamba2Mixer``, whose in-projection [z | x, B, C | dt], convolution, dt_bias, A_log, D, gated norm and
    out-projection archlab's ``mamba2`` holds as they are; one ``use_bias`` for both projections; a final
    RMSNorm; the head tied or not. transformers keeps the residual stream in float32 (``residual_in_fp32``);
    archlab in the model's dtype, the same in float32."""

    parts = "pre-norm RMSNorm, Mamba-2 mixer (SSD, grouped B/C, gated RMSNorm), no MLP, no positions"

    model_type, title, model_class, config_class = "mamba2", "Mamba-2", "Mamba2ForCausalLM", "Mamba2Config"
    prefix = "backbone."
    attention_kind = "mamba2"
    position_kind = "none"
    position_why = " (Mamba-2 has no positions: its recurrence orders the tokens)"
    renames = {"backbone.embedding.": "backbone.embeddings."}  # mamba_ssm's name, which transformers renames too
    keys = {
        **BACKBONE_KEYS,
        "num_heads": "attention.n_head",
        "n_groups": "attention.groups",
        "chunk_size": "attention.scan_chunk",
    }

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        a, d = cfg.attention, cfg.d_model
        # transformers' inner width is expand·hidden_size, expand an integer: head sizes that give one
        whole = [d * k // a.n_head for k in range(1, 5) if d * k % a.n_head == 0]
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre",), ""),
            ("model.mlp.kind", ("none",), " (a Mamba-2 block is its mixer alone)"),
            out_bias(a.qkv_bias, " (one use_bias flag sets both projections' biases)"),
            NO_HEAD_BIAS,
            (
                "model.attention.head_dim",
                (a.head_dim,) if inner(cfg) % d == 0 else tuple(whole),
                f" (n_head·head_dim is transformers' expand·hidden_size: a multiple of d_model={d})",
            ),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        a = cfg.attention
        return dict(
            self.keys_to_hf(cfg),
            head_dim=head_dim(cfg),
            expand=inner(cfg) // cfg.d_model,
            use_bias=a.qkv_bias,
            hidden_act="silu",
            time_step_limit=(a.dt_limit_min, math.inf if a.dt_limit_max is None else a.dt_limit_max),
            residual_in_fp32=True,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "silu (archlab's mamba2 convolves through SiLU)")
        low, high = c.time_step_limit
        cfg = ModelConfig(
            norm=NormConfig(kind="rmsnorm"),
            position=POSITION_OPTIONS.make(kind="none"),
            attention=Mamba2Config(
                head_dim=c.head_dim,
                qkv_bias=c.use_bias,
                out_bias=c.use_bias,
                dt_limit_min=float(low),
                dt_limit_max=None if math.isinf(high) else float(high),
            ),
            mlp=mlp_section("none"),
            head=HeadConfig(bias=False),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        a = cfg.attention

        def mixer(t: Tensors, ours: str, theirs: str) -> None:
            t.add(f"{ours}.in_proj", f"{theirs}.in_proj", a.qkv_bias)
            for name in ("dt_bias", "A_log", "D"):
                t.maps.append(TensorMap(f"{ours}.{name}", (f"{theirs}.{name}",)))
            t.maps.append(TensorMap(f"{ours}.norm_weight", (f"{theirs}.norm.weight",)))
            t.add(f"{ours}.proj", f"{theirs}.out_proj", a.qkv_bias)

        return backbone_tensors(cfg, mixer)


RECORDS: tuple[Family, ...] = (Mamba2(),)
