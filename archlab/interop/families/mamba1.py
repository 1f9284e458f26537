"""Mamba (MambaForCausalLM) and FalconMamba (FalconMambaForCausalLM): every block an RMSNorm and Mamba-1's
selective scan (``attention.kind: mamba``; FalconMamba's with B, C and Δ RMS-normed), no MLP, no positions."""

from __future__ import annotations

import math
from typing import Any

from archlab.config import POSITION_OPTIONS, HeadConfig, ModelConfig, NormConfig
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Rule
from archlab.interop.families.mamba import BACKBONE_KEYS, backbone_tensors
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.mamba import MambaConfig, dt_rank, inner


class Mamba(Family):
    """MambaForCausalLM (state-spaces/mamba-*): pre-norm blocks of an RMSNorm and ``MambaMixer``, whose
    in-projection [x | z], convolution, x_proj [Δ | B | C], dt_proj, A_log, D and out-projection archlab's
    ``mamba`` holds as they are; one ``use_bias`` for both projections; a final RMSNorm; the head tied or
    not. transformers keeps the residual stream in float32 (``residual_in_fp32``); archlab in the model's
    dtype, the same in float32."""

    parts = "pre-norm RMSNorm, Mamba-1 mixer (selective scan, A per channel and state), no MLP, no positions"

    model_type, title, model_class, config_class = "mamba", "Mamba", "MambaForCausalLM", "MambaConfig"
    prefix = "backbone."
    attention_kind = "mamba"
    position_kind = "none"
    position_why = " (Mamba has no positions: its recurrence orders the tokens)"
    renames = {"backbone.embedding.": "backbone.embeddings."}  # mamba_ssm's name, which transformers renames too
    bc_dt_norm = False  # FalconMamba: B, C and Δ RMS-normed
    keys = {
        **BACKBONE_KEYS,
        "use_bias": "attention.bias",
        "time_step_scale": "attention.dt_scale",
        "time_step_init_scheme": "attention.dt_init",
    }

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        d, a = cfg.d_model, cfg.attention
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre",), ""),
            ("model.mlp.kind", ("none",), f" (a {self.title} block is its mixer alone)"),
            NO_HEAD_BIAS,
            (
                "model.attention.inner",
                (a.inner,) if inner(cfg) % d == 0 else (None,),
                f" (transformers' intermediate_size is expand·hidden_size: a multiple of d_model={d})",
            ),  # fmt: skip
            ("model.attention.bc_dt_norm", (self.bc_dt_norm,), f" ({self.title}'s mixer)"),
            *([("model.attention.bc_dt_norm_scale", (False,), " (its norm has no scale)")] if self.bc_dt_norm else []),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        extra = {"mixer_rms_eps": cfg.attention.bc_dt_norm_eps} if self.bc_dt_norm else {}
        return dict(
            self.keys_to_hf(cfg),
            expand=inner(cfg) // cfg.d_model,
            time_step_rank=dt_rank(cfg),
            hidden_act="silu",
            residual_in_fp32=True,
            **extra,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "silu (archlab's mamba convolves through SiLU)")
        rank = int(c.time_step_rank)
        norm = {"bc_dt_norm": True, "bc_dt_norm_eps": float(c.mixer_rms_eps)} if self.bc_dt_norm else {}
        cfg = ModelConfig(
            norm=NormConfig(kind="rmsnorm"),
            position=POSITION_OPTIONS.make(kind="none"),
            attention=MambaConfig(
                inner=int(c.intermediate_size),
                dt_rank=None if rank == math.ceil(c.hidden_size / 16) else rank,
                **norm,
            ),
            mlp=mlp_section("none"),
            head=HeadConfig(bias=False),
        )
        cfg = self.keys_from_hf(c, cfg)
        if cfg.attention.inner == 2 * cfg.d_model:
            cfg.attention.inner = None  # Mamba's expand 2, the field's default
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return backbone_tensors(cfg, lambda t, ours, theirs: mixer_tensors(t, cfg.attention.bias, ours, theirs))


def mixer_tensors(t: Tensors, bias: bool, ours: str, theirs: str) -> None:
    """A Mamba-1 mixer's tensors but its convolution, each as it is (Mamba, FalconMamba, Jamba): in_proj,
    x_proj, dt_proj, A_log, D, out_proj (``bias``: the projections' biases)."""
    t.add(f"{ours}.in_proj", f"{theirs}.in_proj", bias)
    t.add(f"{ours}.x_proj", f"{theirs}.x_proj", False)
    t.add(f"{ours}.dt_proj", f"{theirs}.dt_proj", True)
    for name in ("A_log", "D"):
        t.maps.append(TensorMap(f"{ours}.{name}", (f"{theirs}.{name}",)))
    t.add(f"{ours}.out_proj", f"{theirs}.out_proj", bias)


class FalconMamba(Mamba):
    """FalconMambaForCausalLM (tiiuae/falcon-mamba-7b): Mamba's layout with B, C and Δ's low-rank input
    RMS-normed without a scale (``mixer_rms_eps``) before the scan."""

    parts = "Mamba's, with B, C and Δ RMS-normed (mixer_rms_eps)"
    model_type, title, model_class, config_class = (
        "falcon_mamba",
        "FalconMamba",
        "FalconMambaForCausalLM",
        "FalconMambaConfig",
    )
    bc_dt_norm = True


RECORDS: tuple[Family, ...] = (Mamba(), FalconMamba())
