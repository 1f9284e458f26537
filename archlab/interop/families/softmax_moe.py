"""Softmax-routed mixtures of experts on LLaMA-style layers, each a record over Mixtral's (``moe._CausalSparse``):
OLMoE and FlexOlmo (OLMo 2's QK-norm over the projection; FlexOlmo's norms after each sublayer), GraniteMoE
and GraniteMoeShared (Granite's four multipliers; shared experts as one gated MLP), HunYuan-MoE (one shared
expert of the routed width, a per-head QK-norm after RoPE), ERNIE 4.5 MoE (interleaved RoPE, a
selection-only correction bias on the softmax scores, shared experts, dense first layers) and Aria's text
decoder (experts stored [E, in, out], shared experts), in ``SOFTMAX_MOE``."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Rule
from archlab.interop.families.moe import (
    _CausalSparse,
    dense_tensors,
    is_dense,
    pre_norm_tensors,
)
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.moe import expert_width


def replaced(rules: list[Rule], *new: Rule) -> list[Rule]:
    """``rules`` with each of ``new`` in place of the rule on its field (appended where none is)."""
    by_field = {r[0]: r for r in new}
    kept = [by_field.pop(r[0], r) for r in rules]
    return kept + list(by_field.values())


def uniform(c: Any, name: str) -> Any:
    """Config key ``name``: an int, or a per-layer list of one value (archlab's MoE layers are alike)."""
    value = getattr(c, name)
    if isinstance(value, list):
        if len(set(value)) != 1:
            refuse_hf(c, name, "one value for every layer (archlab's MoE layers are alike)")
        return value[0]
    return value


class _Softmax(_CausalSparse):
    """LLaMA-style attention over softmax top-k routing: what the records here share. The MoE block is
    ``model.layers.i.<moe>``, its router ``<moe>.<router>``; the shared experts ``model.layers.i.<shared>``
    (``shared_names``: its gate, up and down Linears, or ``fused``: one Linear of [gate | up], then down)."""

    moe, router, shared = "mlp", "gate", "mlp.shared_experts"
    shared_names: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
    fused = False

    def attention_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        a = t.cfg.attention
        t.qkv(f"{archlab}.qkv", hf, a.qkv_bias)
        if a.qk_norm != "none":
            t.add(f"{archlab}.q_norm", f"{hf}.q_norm")
            t.add(f"{archlab}.k_norm", f"{hf}.k_norm")
        t.add(f"{archlab}.proj", f"{hf}.o_proj", a.out_bias)

    def mlp_tensors(self, t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
        """A dense layer's gated MLP; else the router, its correction bias, the stacked experts and the
        shared experts under this family's names."""
        if is_dense(lc):
            dense_tensors(t, lc, archlab, hf)
            return
        m = lc.mlp
        t.add(f"{archlab}.router", f"{hf}.{self.router}")
        if m.routing.correction_bias:
            bias = f"{hf}.{self.router}.moe_statics.e_score_correction_bias"
            t.maps.append(TensorMap(f"{archlab}.router_bias", (bias,), "flat", (1, m.routing.n_experts)))
        t.maps.append(TensorMap(f"{archlab}.experts.gate_up", (f"{hf}.experts.gate_up_proj",)))
        t.maps.append(TensorMap(f"{archlab}.experts.down", (f"{hf}.experts.down_proj",)))
        if m.n_shared_experts:
            f, s = m.n_shared_experts * expert_width(lc), f"{hf.removesuffix(self.moe)}{self.shared}"
            names = [f"{s}.{n}" for n in self.shared_names]
            if self.fused:
                t.add(f"{archlab}.shared.gate_up", names[0])
            else:
                t.stacked(f"{archlab}.shared.gate_up", names[:2], False, (f, f))
            t.add(f"{archlab}.shared.down", names[-1])

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return pre_norm_tensors(
            cfg, lambda t, lc, archlab, hf: self.attention_tensors(t, archlab, hf), self.mlp_tensors, self.moe
        )
