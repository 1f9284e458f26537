"""Granite's mixtures of experts: GraniteMoe, GraniteMoeShared (beside a shared gated MLP) and GraniteMoe SWA
(its layers may differ), with Granite's multipliers (the shared softmax-routed parts in ``softmax_moe``)."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs
from archlab.interop.families.base import LAYERS, ONE_BIAS_FLAG, Family, Problem, Rule, out_bias
from archlab.interop.families.granite import (
    check_multipliers,
    multiplier_problems,
    multipliers_from_hf,
    multipliers_to_hf,
)
from archlab.interop.families.granite_variants import GraniteSwa
from archlab.interop.families.layered import LayeredFamily, view
from archlab.interop.families.moe import (
    _Sparse,
)
from archlab.interop.families.phi3 import head_dim_rule
from archlab.interop.families.softmax_moe import _Softmax
from archlab.interop.families.tensors import TensorMap
from archlab.interop.families.values import refuse_hf
from archlab.nn.moe import expert_width


class GraniteMoe(_Softmax):
    """GraniteMoeForCausalLM: Granite's layers and multipliers (``granite.Granite``: embeddings,
    residual branches, the score scale ``attention_multiplier`` and 1 / ``logits_scaling``) over a MoE in
    every layer at ``block_sparse_moe``: the top-k router logits softmaxed, which is softmax over every
    expert renormalised over the top k. Its checkpoints hold the experts stacked, as ``input_linear`` and
    ``output_linear``, and the router as ``router.layer``."""

    model_type, title = "granitemoe", "GraniteMoE"
    model_class, config_class = "GraniteMoeForCausalLM", "GraniteMoeConfig"
    features = frozenset(
        {
            "model.position.scaling.kind",
            "model.embedding_multiplier",
            "model.block.residual_multiplier",
            "model.attention.scale",
            "model.head.logit_scale",
        }
    )
    parts = "Granite's layers and multipliers with a softmax top-k MoE"
    moe, router = "block_sparse_moe", "router"
    checkpoint_renames = {
        ".block_sparse_moe.input_linear.weight": ".block_sparse_moe.experts.gate_up_proj",
        ".block_sparse_moe.output_linear.weight": ".block_sparse_moe.experts.down_proj",
        ".block_sparse_moe.router.layer.weight": ".block_sparse_moe.router.weight",
    }

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
            ("model.mlp.routing.normalize_top_k", (True,), " (it softmaxes the top-k logits: the weights sum to 1)"),
            head_dim_rule(cfg, self.title),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return super().part_problems(cfg) + multiplier_problems(cfg)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        del kwargs["sliding_window"]  # its attention has none
        return dict(
            kwargs,
            attention_bias=cfg.attention.qkv_bias,
            num_local_experts=cfg.mlp.routing.n_experts,
            intermediate_size=expert_width(cfg),
            **multipliers_to_hf(cfg),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        check_multipliers(c)
        mlp = self.moe_from_hf(
            c,
            c.num_local_experts,
            c.intermediate_size,
            normalize_top_k=True,
            aux_loss_weight=float(c.router_aux_loss_coef),
            **self.shared_from_hf(c),
        )
        cfg = self.causal_from_hf(view(c, sliding_window=None, head_dim=None), mlp)
        bias = bool(c.attention_bias)
        cfg.attention.qkv_bias, cfg.attention.out_bias, cfg.attention.head_dim = bias, bias, None
        return multipliers_from_hf(c, cfg)

    def shared_from_hf(self, c: Any) -> dict[str, Any]:
        """The MLPConfig fields of the shared experts (none here)."""
        return {}


class GraniteMoeShared(GraniteMoe):
    """GraniteMoeSharedForCausalLM: GraniteMoE beside a shared gated MLP of ``shared_intermediate_size``
    (``shared_mlp.input_linear`` holds [gate | up]), which archlab holds as n_shared_experts experts of
    the routed width: a multiple of ``intermediate_size``, or none."""

    model_type, title = "granitemoeshared", "GraniteMoeShared"
    model_class, config_class = "GraniteMoeSharedForCausalLM", "GraniteMoeSharedConfig"
    parts = "GraniteMoE's parts with shared experts"
    shared, shared_names, fused = "shared_mlp", ("input_linear", "output_linear"), True

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [r for r in super().rules(cfg) if r[0] != "model.mlp.n_shared_experts"]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), shared_intermediate_size=cfg.mlp.n_shared_experts * expert_width(cfg))

    def shared_from_hf(self, c: Any) -> dict[str, Any]:
        n, rest = divmod(c.shared_intermediate_size, c.intermediate_size)
        if rest:
            refuse_hf(c, "shared_intermediate_size", "a multiple of intermediate_size (archlab's shared experts)")
        return {"n_shared_experts": n}


class GraniteMoeSwa(LayeredFamily, GraniteMoeShared):
    """GraniteMoeSWAForCausalLM: GraniteMoeShared's layers with Granite SWA's attention
    (``granite_variants.GraniteSwa``): a sink logit per head, a ``sliding_window`` on the layers
    ``layer_types`` marks sliding, and per layer the RoPE base of ``layer_rope_theta`` (0: no position
    encoding; one non-zero base, as archlab's layers share one RoPE)."""

    model_type, title = "granitemoe_swa", "GraniteMoE SWA"
    model_class, config_class = "GraniteMoeSWAForCausalLM", "GraniteMoeSWAConfig"
    features = GraniteMoeShared.features | LAYERS | {"model.attention.window", "model.attention.sinks"}
    parts = "GraniteMoeShared's parts with sinks, `window` on any layers and NoPE layers (`model.layers`)"
    nope = True
    hf_layers = GraniteSwa.hf_layers
    layers_to_hf = GraniteSwa.layers_to_hf

    # _Sparse's keys, which _Softmax.to_hf reads; LayeredFamily's method of this name goes unused (to_hf below)
    def base_to_hf(self, cfg: ModelConfig) -> dict[str, Any]:  # pyright: ignore[reportIncompatibleMethodOverride]
        return _Sparse.base_to_hf(self, cfg)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs = layer_configs(cfg)
        rep = next((lc for lc in lcs if lc.position.kind == "rope"), lcs[0])
        return {**GraniteMoeShared.to_hf(self, rep), **self.layers_to_hf(cfg, lcs)}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [*super().rules(cfg), ("model.attention.sinks", (True,), " (every head has a sink logit)")]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        cfg = GraniteMoeShared.from_hf(self, c)
        cfg.attention.sinks = True
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        sinks = [
            TensorMap(f"blocks.{i}.attn.sinks", (f"model.layers.{i}.self_attn.sinks",)) for i in range(cfg.n_layer)
        ]
        return super().tensors(cfg) + sinks


RECORDS: tuple[Family, ...] = (
    GraniteMoe(),
    GraniteMoeShared(),
    GraniteMoeSwa(),
)
