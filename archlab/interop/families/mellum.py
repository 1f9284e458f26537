"""Mellum (``mellum``, JetBrains' Mellum 2): Qwen3-MoE's layers (GQA with a per-head QK-norm before RoPE,
softmax top-k routing) whose sliding and full layers (``layer_types``) each have their own RoPE parameters
(``rope_parameters`` keyed by layer type: local base 10⁴, global 5·10⁵ by default), and a dense gated MLP of
``intermediate_size`` on the layers ``mlp_layer_types`` marks "dense", anywhere. Read into archlab's layer
kinds ``sliding``, ``full`` and each ``_dense``, a kind overriding the window, the RoPE fields that differ
from the full layers' and the MLP kind. Its checkpoints' multi-token-prediction layer (``mtp.*``), which
transformers' causal LM leaves out, is read and written beside it (``families/mtp.py``). Nothing here imports
transformers."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from torch import Tensor

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.interop.families.base import Family, Problem, Rule, bare, ungrouped
from archlab.interop.families.experts import is_dense, mlp_tensors, pre_norm_tensors, stack_saved_experts
from archlab.interop.families.layered import per_type_rope, rope_per_type_to_hf
from archlab.interop.families.layered_moe import _LayeredSparse, _unique, apply_layout, one_window
from archlab.interop.families.mlps import GATED_TO_HF, activation, gated_activation, mlp_section
from archlab.interop.families.mtp import MTP_FEATURES
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, differences, kind_field, leaf_fields, refuse_hf
from archlab.interop.families.windows import FULL, SLIDING, checked_types, layer_types, sliding_window
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width
from archlab.nn.rope import RoPEConfig

_POSITION = frozenset(leaf_fields(RoPEConfig(), "model.position"))  # every field of RoPE, its scaling's one by one


class Mellum(_LayeredSparse):
    """MellumForCausalLM: pre-norm RMSNorm blocks, q/k/v and o biases together (``attention_bias``), q and
    k RMSNormed per head before RoPE on halves of whole heads, sliding windows where ``layer_types`` says
    with RoPE per layer type; softmax over the experts, the top-k renormalised as ``norm_topk_prob`` says,
    experts of ``moe_intermediate_size``, no shared experts; dense layers anywhere by ``mlp_layer_types``."""

    model_type, title, model_class, config_class = "mellum", "Mellum", "MellumForCausalLM", "MellumConfig"
    parts = "Qwen3-MoE's layers, local/global layers each with their own RoPE, dense layers by mlp_layer_types"
    features = (
        frozenset(
            {
                "model.position.scaling.kind",
                "model.attention.qk_norm",
                "model.attention.window",
                "model.layers.first",
                "model.layers.pattern",
            }
        )
        | MTP_FEATURES
    )
    # its checkpoints' multi-token prediction layer, mtp.*: a sliding MoE layer (transformers' mtp_layer_types)
    mtp_keys, mtp_scheme, mtp_layer_kind = ("num_mtp_layers",), "mtp", "sliding"
    varies = frozenset({"model.attention.window", "model.mlp.kind"}) | _POSITION

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        attention: list[Rule] = [("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)")]
        if cfg.head.mtp.depth:
            attention.append(
                ("model.head.mtp.layer", ("sliding",), " (its MTP layer is one of its sliding MoE layers)")
            )
        if is_dense(cfg):
            return attention  # its experts' kind: _LayeredSparse.part_problems, which has the model's
        return [
            *attention,
            ("model.mlp.expert", ("swiglu", "geglu"), " (its experts are gated)"),
            ("model.mlp.bias", (False,), " (its MLPs have no biases)"),
            ("model.mlp.routing.scoring", ("softmax",), ""),
            ("model.mlp.routing.correction_bias", (False,), ""),
            ungrouped(),
            ("model.mlp.routing.routed_scale", (1.0,), ""),
            ("model.mlp.n_shared_experts", (0,), " (it has no shared experts)"),
        ]

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        """One window; one set of RoPE parameters for the sliding layers and one for the full ones."""
        found = one_window(layers)
        first: dict[bool, ModelConfig] = {}
        for i, lc in enumerate(layers):
            ref = first.setdefault(lc.attention.window is None, lc)
            for name, value, wanted in differences(lc.position, ref.position):
                field = kind_field(cfg, layer_kind(cfg, i), f"model.position.{name}")
                why = f" ({self.title} has one set of RoPE parameters per layer type)"
                found.append(Problem(field, value, bare(wanted), why, (wanted,)))
        return _unique(found)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        layers, m = layer_configs(cfg), cfg.mlp
        dense = next((lc for lc in layers if is_dense(lc)), cfg)
        moe = next((lc for lc in layers if not is_dense(lc)), cfg)
        return dict(
            self.base_to_hf(cfg),
            hidden_act=GATED_TO_HF[activation(m)],
            intermediate_size=d_ff(dense),
            moe_intermediate_size=expert_width(moe),
            norm_topk_prob=m.routing.normalize_top_k,
            layer_types=layer_types(layers),
            sliding_window=sliding_window(cfg, layers),
            mlp_layer_types=["dense" if is_dense(lc) else "sparse" for lc in layers],
            rope_parameters=rope_per_type_to_hf(layers),
            num_mtp_layers=cfg.head.mtp.depth or None,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        expert, approximate = gated_activation(c)
        if not c.num_experts:
            refuse_hf(c, "num_experts", "at least 1 (archlab's dense layers are kinds of a MoE model)")
        n, types = c.num_hidden_layers, checked_types(c)
        mlp_types = list(c.mlp_layer_types)
        if len(mlp_types) != n or set(mlp_types) - {"dense", "sparse"}:
            refuse_hf(c, "mlp_layer_types", f"{n} entries, each 'dense' or 'sparse'", mlp_types)
        hd = config_head_dim(c)
        ropes = per_type_rope(c, types, hd)
        base = ropes[FULL] if FULL in ropes else ropes[SLIDING]
        mlp = mlp_section(
            "moe",
            expert=expert,
            approximate=approximate,
            bias=False,
            d_ff=c.intermediate_size,
            expert_d_ff=c.moe_intermediate_size,
            routing=dict(
                n_experts=c.num_experts,
                top_k=c.num_experts_per_tok,
                normalize_top_k=bool(c.norm_topk_prob),
                aux_loss_weight=float(c.router_aux_loss_coef),
            ),
        )
        cfg = self.base_from_hf(c, dataclasses.replace(base), mlp)
        cfg.attention.qk_norm = "head"
        overrides: dict[str, dict[str, dict[str, Any]]] = {}
        for t, name in ((SLIDING, "sliding"), (FULL, "full")):
            kind: dict[str, dict[str, Any]] = {"attention": {"window": c.sliding_window}} if t == SLIDING else {}
            if t in ropes:
                differ = {
                    f.name: getattr(ropes[t], f.name)
                    for f in dataclasses.fields(base)
                    if getattr(ropes[t], f.name) != getattr(base, f.name)
                }
                if differ:
                    kind["position"] = differ
            overrides[name] = kind
            overrides[f"{name}_dense"] = {**kind, "mlp": {"kind": expert}}
        names = [("sliding" if t == SLIDING else "full") + "_dense" * (m == "dense") for t, m in zip(types, mlp_types)]
        return apply_layout(cfg, names, overrides)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        def attention(t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
            bias = t.cfg.attention.qkv_bias
            t.qkv(f"{archlab}.qkv", hf, bias)
            t.add(f"{archlab}.q_norm", f"{hf}.q_norm")
            t.add(f"{archlab}.k_norm", f"{hf}.k_norm")
            t.add(f"{archlab}.proj", f"{hf}.o_proj", bias)

        return pre_norm_tensors(cfg, attention, mlp_tensors)

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Without the multi-token-prediction tensors (``mtp.*``, which transformers ignores on loading),
        each expert stacked."""
        return stack_saved_experts(cfg, {k: v for k, v in state.items() if not re.match(r"mtp\.", k)})


RECORDS: tuple[Family, ...] = (Mellum(),)
