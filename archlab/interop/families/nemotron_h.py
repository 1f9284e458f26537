"""Nemotron-H (``NemotronHForCausalLM``, Nemotron 3's MoE layouts too): every Hugging Face layer is one RMSNorm
and one mixer, Mamba-2 (``linear_attention``), NoPE GQA attention (``full_attention``), an up/down MLP
(``mlp``, ReLU² as published) or a MoE (``moe``: sigmoid top-k of up/down experts with a selection-only
correction bias, expert groups and a routed scale, beside shared up/down experts; no latent projection).

archlab's pre-norm block is a token mixer and then an MLP, so a mixer layer and the ``mlp`` layer right after
it are one archlab block (the two norms its ``attn_norm`` and ``mlp_norm``), and a mixer layer followed by
another mixer is a block with ``mlp: none`` (neither MLP nor its norm). An ``mlp`` layer that follows no
mixer (the first layer, or two in a row) has no archlab block: refused, naming ``layers_block_type``; so is a
model with both ``mlp`` and ``moe`` layers (archlab's model has one MLP). The model's own parts are an
attention layer's with its MLP (dense, or the MoE); the kinds ``mamba2`` (Mamba-2, Bamba's reset kind,
with the dt fields set: its mixer clamps dt below at ``time_step_min``, whatever ``time_step_limit`` says,
so archlab's ``dt_limit_min`` is ``dt_min``), ``mamba2_alone`` and ``attention_alone`` (the MLP none) and
``attention`` (overriding nothing), in the shortest ``first`` and ``pattern``. Checkpoints name the base
model ``backbone.`` and save each expert apart: renamed and stacked on loading, as transformers does (its MoE
layers' parts in ``nemotron_moe``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from torch import Tensor

from archlab.config import (
    POSITION_OPTIONS,
    BlockConfig,
    HeadConfig,
    ModelConfig,
    NormConfig,
    n_kv_head,
)
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig, shortest_layout
from archlab.interop.families.arcee import UP_DOWN_FROM_HF, UP_DOWN_KINDS, UP_DOWN_TO_HF
from archlab.interop.families.bamba import HELD, hybrid_problems, is_mamba, mamba_kind, mamba_tensors
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule, bare, first_per_field, out_bias
from archlab.interop.families.mlps import activation, mlp_section
from archlab.interop.families.nemotron_moe import moe_from_hf, moe_rules, moe_tensors, moe_to_hf, stack_up_down_experts
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import differences, kind_field, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mixers.mamba2 import Mamba2Config
from archlab.nn.mixers.mamba2 import head_dim as mamba_head_dim
from archlab.nn.mlp import d_ff

MAMBA_T, ATTN_T, MLP_T, MOE_T = "linear_attention", "full_attention", "mlp", "moe"
KINDS = {
    (True, True): "mamba2",
    (True, False): "mamba2_alone",
    (False, True): "attention",
    (False, False): "attention_alone",
}
NO_MLP = {"kind": "none"}
# the Mamba-2 fields a Nemotron-H config holds: Bamba's and the dt initialisation (time_step_min also the clamp)
NEMOTRON_HELD = (*HELD, "dt_min", "dt_max", "dt_init_floor")


def has_mlp(lc: ModelConfig) -> bool:
    return lc.mlp.kind != "none"


class NemotronH(Family):
    """NemotronHForCausalLM: see the module docstring."""

    mixer_kinds = ("mamba2",)

    model_type, title, model_class, config_class = "nemotron_h", "Nemotron-H", "NemotronHForCausalLM", "NemotronHConfig"
    prefix = "model."
    position_kind = "none"
    position_why = " (its attention layers have no position encoding)"
    renames = {"backbone.": "model."}
    parts = "Mamba-2, NoPE GQA and ReLU² MLP or sigmoid-MoE layers, a mixer and the MLP after it as one block"
    features = frozenset({"model.layers.first", "model.layers.pattern"})
    keys = {
        "vocab_size": "vocab_size",
        "hidden_size": "d_model",
        "num_attention_heads": "attention.n_head",
        "max_position_embeddings": "context_length",
        "initializer_range": "init_std",
        "layer_norm_epsilon": "norm.eps",
        "attention_dropout": "attention.dropout",
        "mlp_bias": "mlp.bias",
    }

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", ("pre",), ""),
            NO_HEAD_BIAS,
            ("model.head.tied", (False,), " (its lm_head is never tied, whatever tie_word_embeddings says)"),
            ("model.attention.qkv_bias", (False,), " (its attention has no biases)"),
            out_bias(False, " (its attention has no biases)"),
            ("model.mlp.kind", (*UP_DOWN_KINDS, "moe"), " (its MLP is up_proj, then down_proj, without a gate)"),
            *(moe_rules() if cfg.mlp.kind == "moe" else []),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``Family.problems`` of the model's own parts (an attention layer's and its MLP), then Bamba's checks
        of the Mamba-2 kinds with the MLP taken out where a kind has none, and the dt clamp that is dt_min."""
        found = super().part_problems(cfg)
        lcs = layer_configs(cfg)
        # Bamba's checks, on a view where every layer keeps the model's MLP (whether it has one is the kind's)
        view = dataclasses.replace(cfg, layers=dataclasses.replace(cfg.layers, kinds=_with_mlp(cfg)))
        found += [p for p in hybrid_problems(view, self.title, held=NEMOTRON_HELD) if ".mlp." not in p.field]
        for i, lc in enumerate(lcs):
            kind = layer_kind(cfg, i)
            if kind is None or not has_mlp(lc):
                continue
            for name, value, expected in differences(lc.mlp, cfg.mlp):  # an MLP of another kind: its kind
                field = kind_field(cfg, kind, f"model.mlp.{name}")
                found.append(
                    Problem(field, value, bare(expected), f" ({self.title} has one MLP, or none)", (expected,))
                )
        mamba = next((lc.attention for lc in lcs if is_mamba(lc)), None)
        if mamba is not None and mamba.dt_limit_min != mamba.dt_min:
            kind = layer_kind(cfg, next(i for i, lc in enumerate(lcs) if is_mamba(lc)))
            why = " (its Mamba-2 mixer clamps dt below at time_step_min, the dt initialisation's minimum)"
            field = kind_field(cfg, kind, "model.attention.dt_limit_min")
            found.append(Problem(field, mamba.dt_limit_min, f"{mamba.dt_min} (dt_min)", why))
        if cfg.mlp.kind == "moe" and cfg.mlp.n_shared_experts < 1:
            why = " (its MoE layers always have shared experts)"
            found.append(Problem("model.mlp.n_shared_experts", cfg.mlp.n_shared_experts, "at least 1", why))
        return first_per_field(found)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs = layer_configs(cfg)
        types: list[str] = []
        m, mlp_t = cfg.mlp, MOE_T if cfg.mlp.kind == "moe" else MLP_T
        for lc in lcs:
            types += [MAMBA_T if is_mamba(lc) else ATTN_T] + ([mlp_t] if has_mlp(lc) else [])
        moe = moe_to_hf(cfg) if m.kind == "moe" else {}
        out = dict(
            self.keys_to_hf(cfg),
            layers_block_type=types,
            num_key_value_heads=n_kv_head(cfg),
            head_dim=head_dim(cfg),
            intermediate_size=d_ff(cfg),
            mlp_hidden_act=UP_DOWN_TO_HF[activation(m)],
            **moe,
            attention_bias=False,
            tie_word_embeddings=False,
            residual_in_fp32=False,
        )
        lc = next((lc for lc in lcs if is_mamba(lc)), None)
        if lc is not None:
            m = lc.attention
            out.update(
                mamba_num_heads=m.n_head,
                mamba_head_dim=mamba_head_dim(lc),
                n_groups=m.groups,
                ssm_state_size=m.state_size,
                conv_kernel=m.conv_kernel,
                chunk_size=m.scan_chunk,
                use_conv_bias=m.conv_bias,
                use_bias=m.qkv_bias,
                mamba_hidden_act="silu",
                time_step_min=m.dt_min,
                time_step_max=m.dt_max,
                time_step_floor=m.dt_init_floor,
                time_step_limit=(m.dt_min, math.inf),
            )
        return out

    def from_hf(self, c: Any) -> ModelConfig:
        if c.mlp_hidden_act not in UP_DOWN_FROM_HF:
            refuse_hf(c, "mlp_hidden_act", f"one of {sorted(UP_DOWN_FROM_HF)}")
        if c.mamba_hidden_act != "silu":
            refuse_hf(c, "mamba_hidden_act", "'silu' (archlab's mamba2 convolves through SiLU)")
        if c.sliding_window is not None:
            refuse_hf(c, "sliding_window", "null (archlab holds Nemotron-H's attention without a window)")
        types = list(c.layers_block_type)
        if {MLP_T, MOE_T} <= set(types):
            refuse_hf(
                c, "layers_block_type", "'mlp' layers or 'moe' layers, not both (archlab's model has one MLP)", types
            )
        names: list[str] = []
        for i, t in enumerate(types):
            if t in (MLP_T, MOE_T):
                if i == 0 or types[i - 1] not in (MAMBA_T, ATTN_T):
                    why = "an 'mlp' or 'moe' layer only right after a mixer layer (archlab's block: a mixer, then its MLP)"
                    refuse_hf(c, "layers_block_type", why, types)
                continue
            names.append(KINDS[(t == MAMBA_T, i + 1 < len(types) and types[i + 1] in (MLP_T, MOE_T))])
        kind, approximate = UP_DOWN_FROM_HF[c.mlp_hidden_act]
        mlp = mlp_section(kind, d_ff=c.intermediate_size, bias=bool(c.mlp_bias), approximate=approximate)
        if MOE_T in types:
            mlp = moe_from_hf(c, mlp)
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="pre"),
            position=POSITION_OPTIONS.make(kind="none"),
            attention=AttentionConfig(
                n_kv_head=c.num_key_value_heads, head_dim=c.head_dim, qkv_bias=False, out_bias=False
            ),
            mlp=mlp,
            head=HeadConfig(tied=False, bias=False),
        )
        cfg = self.keys_from_hf(c, cfg)
        cfg.n_layer = len(names)
        cfg.attention.dropout = float(cfg.attention.dropout)
        cfg.mlp.bias = bool(cfg.mlp.bias)
        if cfg.mlp.kind == "moe" and cfg.mlp.bias:
            why = "false with 'moe' layers (archlab's experts and shared experts share one bias flag)"
            refuse_hf(c, "mlp_bias", why)
        kinds: dict[str, dict[str, Any]] = {}
        attention: dict[str, Any] = {}
        if any(n.startswith("mamba2") for n in names):
            mamba = Mamba2Config(
                n_head=c.mamba_num_heads,
                head_dim=c.mamba_head_dim,
                qkv_bias=bool(c.use_bias),
                out_bias=bool(c.use_bias),
                state_size=c.ssm_state_size,
                groups=c.n_groups,
                conv_kernel=c.conv_kernel,
                conv_bias=bool(c.use_conv_bias),
                scan_chunk=c.chunk_size,
                dt_min=float(c.time_step_min),
                dt_max=float(c.time_step_max),
                dt_init_floor=float(c.time_step_floor),
                dt_limit_min=float(c.time_step_min),
            )
            attention = mamba_kind(mamba, c.hidden_size, held=NEMOTRON_HELD)
        for name in dict.fromkeys(names):
            kinds[name] = {"attention": dict(attention)} if name.startswith("mamba2") else {}
            if name.endswith("_alone"):
                kinds[name]["mlp"] = dict(NO_MLP)
        if set(names) != {"attention"}:
            first, pattern = shortest_layout(names)
            cfg.layers = LayersConfig(kinds=kinds, first=first, pattern=pattern)
        return cfg

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        return stack_up_down_experts(cfg, state) if cfg.mlp.kind == "moe" else state

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embeddings")
        j = 0
        for i, lc in enumerate(layer_configs(cfg)):
            b, h = f"blocks.{i}", f"model.layers.{j}"
            t.add(f"{b}.attn_norm", f"{h}.norm")
            if is_mamba(lc):
                mamba_tensors(t, lc, f"{b}.attn", f"{h}.mixer")
            else:
                t.qkv(f"{b}.attn.qkv", f"{h}.mixer", False)
                t.add(f"{b}.attn.proj", f"{h}.mixer.o_proj")
            j += 1
            if has_mlp(lc):
                h = f"model.layers.{j}"
                t.add(f"{b}.mlp_norm", f"{h}.norm")
                if lc.mlp.kind == "moe":
                    moe_tensors(t, f"{b}.mlp", f"{h}.mixer")
                else:
                    t.add(f"{b}.mlp.fc", f"{h}.mixer.up_proj", lc.mlp.bias)
                    t.add(f"{b}.mlp.proj", f"{h}.mixer.down_proj", lc.mlp.bias)
                j += 1
        t.add("final_norm", "model.norm_f")
        return t.head()


def _with_mlp(cfg: ModelConfig) -> dict[str, Any]:
    """The layer kinds with their MLP override taken out (Bamba's checks compare every layer's MLP)."""
    return {
        name: {k: v for k, v in (kind or {}).items() if k != "mlp"} for name, kind in (cfg.layers.kinds or {}).items()
    }


RECORDS: tuple[Family, ...] = (NemotronH(),)
