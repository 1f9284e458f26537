"""Granite's variants: HyperCLOVA X (Granite's multipliers with a norm
after each sublayer, ``use_post_norm``: archlab's sandwich block, and the logits multiplied by
``logits_scaling``) and Granite SWA (Granite with a sink logit per head, sliding layers by ``layer_types``
and NoPE layers where ``layer_rope_theta`` is 0)."""

from __future__ import annotations

import dataclasses
from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import LAYERS, Family, Rule
from archlab.interop.families.granite import (
    CHECKS,
    Granite,
    check_multipliers,
    granite_to_hf,
    multipliers_from_hf,
)
from archlab.interop.families.layered import Layer, LayeredFamily
from archlab.interop.families.llama import Llama
from archlab.interop.families.phi3 import fixed_head_dim, head_dim_rule
from archlab.interop.families.rope import rope_from_hf
from archlab.interop.families.tensors import TensorMap
from archlab.interop.families.values import refuse_hf
from archlab.interop.families.windows import SLIDING, checked_types, sliding_to_hf
from archlab.nn.mixers.base import head_dim

MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")


def swa_layers(c: Any) -> list[Layer]:
    """Granite SWA's layers: ``sliding_window`` where ``layer_types`` says sliding, the RoPE base of
    ``layer_rope_theta`` (0: no position encoding; one non-zero base, as archlab's layers share one RoPE)."""
    n, types = c.num_hidden_layers, checked_types(c)
    thetas = list(c.layer_rope_theta or [])
    if len(thetas) != n or any(isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0 for t in thetas):
        refuse_hf(c, "layer_rope_theta", f"{n} RoPE bases, each >= 0 (0: no position encoding)", thetas)
    if len({t for t in thetas if t}) > 1:
        refuse_hf(c, "layer_rope_theta", "one non-zero base (archlab's layers share one RoPE), or 0", thetas)
    rope = rope_from_hf(c, fixed_head_dim(c), partial=False)
    rope = dataclasses.replace(rope, theta=float(next((t for t in thetas if t), rope.theta)))
    nope = dataclasses.replace(rope, kind="none")
    return [Layer(c.sliding_window if t == SLIDING else None, rope if th else nope) for t, th in zip(types, thetas)]


def swa_layers_to_hf(cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
    """Granite SWA's keys of the layers: the sliding ones and their window, each layer's RoPE base (0: none)."""
    thetas = [lc.position.theta if lc.position.kind == "rope" else 0 for lc in lcs]
    return dict(sliding_to_hf(cfg, lcs), layer_rope_theta=thetas)


SINKS: Rule = ("model.attention.sinks", (True,), " (every head has a sink logit)")


def sink_tensors(cfg: ModelConfig) -> list[TensorMap]:
    """Each layer's sink logits (``self_attn.sinks``)."""
    return [TensorMap(f"blocks.{i}.attn.sinks", (f"model.layers.{i}.self_attn.sinks",)) for i in range(cfg.n_layer)]


class HyperClovaX(Llama):
    """HyperCLOVAXForCausalLM: Granite's layers and multipliers (``granite``) with an explicit ``head_dim``, the logits
    multiplied by ``logits_scaling`` (Granite divides), and with ``use_post_norm`` each sublayer's output
    RMSNormed (``post_norm1``, ``post_norm2``) before it is scaled into the residual: a sandwich block."""

    defers = True  # to Granite's and SmolLM3's layouts, which it holds too

    model_type, title = "hyperclovax", "HyperCLOVA X"
    model_class, config_class = "HyperCLOVAXForCausalLM", "HyperCLOVAXConfig"
    features = Granite.features
    parts = "Granite's multipliers in pre-norm or sandwich blocks (`use_post_norm`), a logit multiplier"
    post_norms = {"attn_out_norm": "post_norm1", "mlp_out_norm": "post_norm2"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        block = ("model.block.kind", ("pre", "sandwich"), " (use_post_norm: sandwich)")
        return [block if r[0] == block[0] else r for r in super().rules(cfg)]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:  # any logit scale: logits_scaling multiplies
        return {
            **granite_to_hf(super().to_hf(cfg), cfg),
            "head_dim": head_dim(cfg),
            "logits_scaling": cfg.head.logit_scale,
            "use_post_norm": cfg.block.kind == "sandwich",
        }

    def from_hf(self, c: Any) -> ModelConfig:
        for name in MULTIPLIERS:
            value = getattr(c, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                refuse_hf(c, name, "a positive number")
        cfg = super().from_hf(c)
        cfg.embedding_multiplier = float(c.embedding_multiplier)
        cfg.block.residual_multiplier = float(c.residual_multiplier)
        scale = float(c.attention_multiplier)
        cfg.attention.scale = None if scale == head_dim(cfg) ** -0.5 else scale
        cfg.head.logit_scale = float(c.logits_scaling)
        cfg.block.kind = "sandwich" if c.use_post_norm else "pre"
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        maps = super().tensors(cfg)
        if cfg.block.kind != "sandwich":
            return maps
        return maps + [
            TensorMap(f"blocks.{i}.{archlab}.weight", (f"model.layers.{i}.{hf}.weight",))
            for i in range(cfg.n_layer)
            for archlab, hf in self.post_norms.items()
        ]


class GraniteSwa(LayeredFamily, Llama):
    """GraniteSWAForCausalLM: Granite's layers and multipliers (``granite``) with a learned sink logit per head
    (``self_attn.sinks``, always present), a ``sliding_window`` on the layers ``layer_types`` marks
    sliding, and per layer the RoPE base of ``layer_rope_theta`` (0: no position encoding). archlab's
    layers hold one RoPE for every layer with RoPE: two different non-zero bases are refused."""

    model_type, title = "granite_swa", "Granite SWA"
    model_class, config_class = "GraniteSWAForCausalLM", "GraniteSWAConfig"
    features = Granite.features | LAYERS | {"model.attention.window", "model.attention.sinks"}
    parts = "Granite's multipliers with sinks, `window` on any layers and NoPE layers (`model.layers`)"
    nope = True
    checks = CHECKS

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [*super().rules(cfg), head_dim_rule(cfg, self.title), SINKS]

    def hf_layers(self, c: Any) -> list[Layer]:
        return swa_layers(c)

    def uniform_to_hf(self, rep: ModelConfig) -> dict[str, Any]:
        return granite_to_hf(super().uniform_to_hf(rep), rep)

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        check_multipliers(c)
        cfg = Llama.from_hf(self, c)
        cfg.attention.head_dim = None
        cfg = multipliers_from_hf(c, cfg)
        cfg.attention.sinks = True
        return cfg

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        return swa_layers_to_hf(cfg, lcs)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return super().tensors(cfg) + sink_tensors(cfg)


RECORDS: tuple[Family, ...] = (HyperClovaX(), GraniteSwa())
