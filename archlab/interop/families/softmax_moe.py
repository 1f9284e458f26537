"""Softmax-routed mixtures of experts on LLaMA-style layers (``_Softmax``): Mixtral, Qwen3-MoE and DBRX
(their modules), OLMoE and FlexOlmo (OLMo 2's QK-norm over the projection; FlexOlmo's norms after each
sublayer), GraniteMoE, GraniteMoeShared and GraniteMoE SWA (Granite's four multipliers; shared experts as one
gated MLP), HunYuan-MoE (one shared expert of the routed width, a per-head QK-norm after RoPE), ERNIE 4.5 MoE
(interleaved RoPE, a selection-only correction bias on the softmax scores, shared experts, dense first
layers) and Aria's text decoder (experts stored [E, in, out], shared experts)."""

from __future__ import annotations

from typing import Any

from archlab.config import MLPConfig, ModelConfig, n_kv_head
from archlab.interop.families.base import Check, Family, Problem, Rule, ungrouped
from archlab.interop.families.experts import dense_tensors, is_dense, pre_norm_tensors
from archlab.interop.families.moe import _Sparse
from archlab.interop.families.rope import rope_from_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
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


class _Softmax(_Sparse):
    """LLaMA's attention (GQA, any head_dim, a sliding window on every layer) over softmax top-k routing
    without groups, correction bias or shared experts unless a record says: what the records here share. The
    MoE block is ``model.layers.i.<moe>``, its router ``<moe>.<router>``; the shared experts
    ``model.layers.i.<shared>`` (``shared_names``: its gate, up and down Linears, or ``fused``: one Linear of
    [gate | up], then down)."""

    features = frozenset({"model.position.scaling.kind", "model.attention.window"})
    moe, router, shared = "mlp", "gate", "mlp.shared_experts"
    shared_names: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
    fused = False
    checks: tuple[Check, ...] = (Family.full_rotary,)  # after its rules' problems, in order
    rope_keys: frozenset[str] = frozenset()  # rope_parameters keys of the family's own, read by its from_hf

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.routing.scoring", ("softmax",), ""),
            ("model.mlp.routing.correction_bias", (False,), ""),
            ungrouped(),
            ("model.mlp.routing.routed_scale", (1.0,), ""),
            ("model.mlp.n_shared_experts", (0,), " (it has no shared experts)"),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return super().part_problems(cfg) + [p for check in self.checks for p in check(cfg)]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        m = cfg.mlp
        return dict(
            self.base_to_hf(cfg),
            num_key_value_heads=n_kv_head(cfg),
            sliding_window=cfg.attention.window,
            num_experts_per_tok=m.routing.top_k,
            router_aux_loss_coef=m.routing.aux_loss_weight,
        )

    def causal_from_hf(self, c: Any, mlp: MLPConfig) -> ModelConfig:
        """archlab's config of LLaMA-style attention over ``mlp``."""
        hd = config_head_dim(c)
        attention = AttentionConfig(
            n_kv_head=c.num_key_value_heads or c.num_attention_heads,
            head_dim=hd,
            qkv_bias=False,
            out_bias=False,
            dropout=float(c.attention_dropout),
            window=c.sliding_window,
        )
        position = rope_from_hf(c, hd, partial=False, scalings=self.rope_types(), ignored=self.rope_keys)
        return self.base_from_hf(c, position, attention, mlp)

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
