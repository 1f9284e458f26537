"""Granite's mixtures of experts: GraniteMoe, GraniteMoeShared (beside a shared gated MLP) and GraniteMoE SWA
(its layers may differ), each a softmax-routed record (``softmax_moe``) with Granite's multipliers, and the
rules, keys and reading they share."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import LAYERS, ONE_BIAS_FLAG, Family, Rule, out_bias
from archlab.interop.families.granite import (
    CHECKS,
    MULTIPLIER_FEATURES,
    check_multipliers,
    multipliers_from_hf,
    multipliers_to_hf,
)
from archlab.interop.families.granite_variants import SINKS, sink_tensors, swa_layers, swa_layers_to_hf
from archlab.interop.families.layered import Layer, LayeredFamily, view
from archlab.interop.families.phi3 import head_dim_rule
from archlab.interop.families.softmax_moe import _Softmax
from archlab.interop.families.tensors import TensorMap
from archlab.interop.families.values import refuse_hf
from archlab.nn.moe import expert_width

FEATURES = frozenset({"model.position.scaling.kind"}) | MULTIPLIER_FEATURES
# its checkpoints' names (the experts stacked as input_linear and output_linear, the router in router.layer)
CHECKPOINT_RENAMES = {
    ".block_sparse_moe.input_linear.weight": ".block_sparse_moe.experts.gate_up_proj",
    ".block_sparse_moe.output_linear.weight": ".block_sparse_moe.experts.down_proj",
    ".block_sparse_moe.router.layer.weight": ".block_sparse_moe.router.weight",
}
SHARED_NAMES = ("input_linear", "output_linear")  # shared_mlp's: [gate | up], then down


def granite_moe_rules(rules: list[Rule], cfg: ModelConfig, title: str, shared: bool) -> list[Rule]:
    """``rules`` (the softmax records') with GraniteMoE's: one bias flag, the top-k softmaxed, head_dim =
    hidden_size / heads; with a ``shared`` MLP, any number of shared experts."""
    rules = rules + [
        out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
        ("model.mlp.routing.normalize_top_k", (True,), " (it softmaxes the top-k logits: the weights sum to 1)"),
        head_dim_rule(cfg, title),
    ]
    return [r for r in rules if r[0] != "model.mlp.n_shared_experts"] if shared else rules


def granite_moe_to_hf(kwargs: dict[str, Any], cfg: ModelConfig, shared: bool) -> dict[str, Any]:
    """The softmax records' keys ``kwargs`` as GraniteMoE's: no window, the expert count and width, the
    multipliers; with a ``shared`` MLP, its width."""
    del kwargs["sliding_window"]  # its attention has none
    kwargs = dict(
        kwargs,
        attention_bias=cfg.attention.qkv_bias,
        num_local_experts=cfg.mlp.routing.n_experts,
        intermediate_size=expert_width(cfg),
        **multipliers_to_hf(cfg),
    )
    return dict(kwargs, shared_intermediate_size=cfg.mlp.n_shared_experts * expert_width(cfg)) if shared else kwargs


def shared_from_hf(c: Any) -> dict[str, Any]:
    """The MoE fields of GraniteMoeShared's shared MLP: n_shared_experts experts of the routed width (a
    multiple of ``intermediate_size``)."""
    n, rest = divmod(c.shared_intermediate_size, c.intermediate_size)
    if rest:
        refuse_hf(c, "shared_intermediate_size", "a multiple of intermediate_size (archlab's shared experts)")
    return {"n_shared_experts": n}


def granite_moe_from_hf(family: _Softmax, c: Any, shared: bool) -> ModelConfig:
    """archlab's config of a GraniteMoE config ``c`` (with a ``shared`` MLP: GraniteMoeShared's)."""
    check_multipliers(c)
    mlp = family.moe_from_hf(
        c,
        c.num_local_experts,
        c.intermediate_size,
        normalize_top_k=True,
        aux_loss_weight=float(c.router_aux_loss_coef),
        **(shared_from_hf(c) if shared else {}),
    )
    cfg = family.causal_from_hf(view(c, sliding_window=None, head_dim=None), mlp)
    bias = bool(c.attention_bias)
    cfg.attention.qkv_bias, cfg.attention.out_bias, cfg.attention.head_dim = bias, bias, None
    return multipliers_from_hf(c, cfg)


class GraniteMoe(_Softmax):
    """GraniteMoeForCausalLM: Granite's layers and multipliers (``granite.Granite``: embeddings,
    residual branches, the score scale ``attention_multiplier`` and 1 / ``logits_scaling``) over a MoE in
    every layer at ``block_sparse_moe``: the top-k router logits softmaxed, which is softmax over every
    expert renormalised over the top k. Its checkpoints hold the experts stacked, as ``input_linear`` and
    ``output_linear``, and the router as ``router.layer``."""

    model_type, title = "granitemoe", "GraniteMoE"
    model_class, config_class = "GraniteMoeForCausalLM", "GraniteMoeConfig"
    features = FEATURES
    parts = "Granite's layers and multipliers with a softmax top-k MoE"
    moe, router = "block_sparse_moe", "router"
    checkpoint_renames = CHECKPOINT_RENAMES
    checks = CHECKS

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return granite_moe_rules(super().rules(cfg), cfg, self.title, shared=False)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return granite_moe_to_hf(super().to_hf(cfg), cfg, shared=False)

    def from_hf(self, c: Any) -> ModelConfig:
        return granite_moe_from_hf(self, c, shared=False)


class GraniteMoeShared(_Softmax):
    """GraniteMoeSharedForCausalLM: GraniteMoE beside a shared gated MLP of ``shared_intermediate_size``
    (``shared_mlp.input_linear`` holds [gate | up]), which archlab holds as n_shared_experts experts of
    the routed width: a multiple of ``intermediate_size``, or none."""

    model_type, title = "granitemoeshared", "GraniteMoeShared"
    model_class, config_class = "GraniteMoeSharedForCausalLM", "GraniteMoeSharedConfig"
    features = FEATURES
    parts = "GraniteMoE's parts with shared experts"
    moe, router, shared, shared_names, fused = "block_sparse_moe", "router", "shared_mlp", SHARED_NAMES, True
    checkpoint_renames = CHECKPOINT_RENAMES
    checks = CHECKS

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return granite_moe_rules(super().rules(cfg), cfg, self.title, shared=True)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return granite_moe_to_hf(super().to_hf(cfg), cfg, shared=True)

    def from_hf(self, c: Any) -> ModelConfig:
        return granite_moe_from_hf(self, c, shared=True)


class GraniteMoeSwa(LayeredFamily, _Softmax):
    """GraniteMoeSWAForCausalLM: GraniteMoeShared's layers with Granite SWA's attention
    (``granite_variants.GraniteSwa``): a sink logit per head, a ``sliding_window`` on the layers
    ``layer_types`` marks sliding, and per layer the RoPE base of ``layer_rope_theta`` (0: no position
    encoding; one non-zero base, as archlab's layers share one RoPE)."""

    model_type, title = "granitemoe_swa", "GraniteMoE SWA"
    model_class, config_class = "GraniteMoeSWAForCausalLM", "GraniteMoeSWAConfig"
    features = FEATURES | LAYERS | {"model.attention.window", "model.attention.sinks"}
    parts = "GraniteMoeShared's parts with sinks, `window` on any layers and NoPE layers (`model.layers`)"
    moe, router, shared, shared_names, fused = "block_sparse_moe", "router", "shared_mlp", SHARED_NAMES, True
    checkpoint_renames = CHECKPOINT_RENAMES
    checks = CHECKS
    nope = True

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [*granite_moe_rules(super().rules(cfg), cfg, self.title, shared=True), SINKS]

    def hf_layers(self, c: Any) -> list[Layer]:
        return swa_layers(c)

    def uniform_to_hf(self, rep: ModelConfig) -> dict[str, Any]:
        return granite_moe_to_hf(super().uniform_to_hf(rep), rep, shared=True)

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        cfg = granite_moe_from_hf(self, c, shared=True)
        cfg.attention.sinks = True
        return cfg

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        return swa_layers_to_hf(cfg, lcs)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return super().tensors(cfg) + sink_tensors(cfg)


RECORDS: tuple[Family, ...] = (
    GraniteMoe(),
    GraniteMoeShared(),
    GraniteMoeSwa(),
)
