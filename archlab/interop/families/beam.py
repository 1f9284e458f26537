"""Beam (Reflection AI, ``BeamForCausalLM``): AFMoE's sandwich blocks and local RoPE / global NoPE layers with
depth-scaled residual adds (``model.block.residual_rule: depth``), an elementwise output gate with a bias per
head (``model.attention.gate_head_bias``), the NoPE layers' queries times (1 + (p + 1)/2048)^0.1 by each
row's position (``query_scale_form: power``), DeepSeek-V3's routing and a final logit soft-cap."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import BlockConfig, ModelConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.interop.families.afmoe import POSITION_WHY, global_nope_problems
from archlab.interop.families.base import Family, Problem, Rule, fmt
from archlab.interop.families.experts import is_dense, mlp_tensors, stack_saved_experts
from archlab.interop.families.layered import view
from archlab.interop.families.layered_moe import _LayeredSparse, _unique, apply_layout, one_window
from archlab.interop.families.mlps import GATED_TO_HF, activation, corrected_sigmoid_moe
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, kind_field, refuse_hf
from archlab.interop.families.windows import FULL, SLIDING, checked_types, sliding_to_hf
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width

# the NoPE layers' query scale as transformers' compute_attention_scaling fixes it: (1 + (p + 1) / 2048)^0.1
QUERY_SCALE = dict(
    query_scale_beta=0.1,
    query_scale_length=2048,
    query_scale_offset=1,
    query_scale_by="position",
    query_scale_form="power",
)
SANDWICH = (  # archlab's sandwich norms, Beam's names
    ("attn_norm", "input_layernorm"),
    ("attn_out_norm", "post_attention_layernorm"),
    ("mlp_norm", "pre_feedforward_layernorm"),
    ("mlp_out_norm", "post_feedforward_layernorm"),
)


class Beam(_LayeredSparse):
    """BeamForCausalLM: a norm before and after each sublayer, each sublayer's add depth-scaled,
    x·√((i−1)/i) + f(x)/√i; q/k/v and o without biases, q and k RMSNormed per head before RoPE; an output gate
    σ(``gate_proj``·x + ``gate_bias``) per value dim, its bias one per head; sliding-window attention with RoPE
    on the ``sliding_attention`` layers (``rope_parameters.sliding_attention``) and full attention without
    positions on the others (``rope_parameters.full_attention`` null), their queries times
    (1 + (p + 1)/2048)^0.1 at each row's position p. Dense SwiGLU layers where ``mlp_layer_types`` says,
    MoE ones elsewhere: sigmoid scores, the top-k of scores + ``e_score_correction_bias`` within the
    ``topk_group`` best of ``n_group`` groups, renormalised as ``norm_topk_prob``, times
    ``routed_scaling_factor``; the logits soft-capped (``final_logit_softcapping``). Its float32 SwiGLU
    products are a float32 model's anyway. Kinds: ``sliding`` or ``full``, each ``_dense`` on the dense layers."""

    parts = "sandwich block, depth-scaled adds, gated attention, local RoPE / global NoPE scaled queries, V3 MoE"

    model_type, title, model_class, config_class = "beam", "Beam", "BeamForCausalLM", "BeamConfig"
    features = frozenset(
        {
            "model.position.scaling.kind",
            "model.attention.qk_norm",
            "model.attention.window",
            "model.attention.gate",
            "model.attention.gate_head_bias",
            "model.attention.query_scale_beta",
            "model.attention.query_scale_by",
            "model.attention.query_scale_form",
            "model.block.residual_rule",
            "model.head.softcap",
            "model.layers.first",
            "model.layers.pattern",
        }
    )
    position_why = POSITION_WHY
    block_kind = "sandwich"
    varies = frozenset(
        {
            "model.attention.window",
            "model.position.kind",
            "model.mlp.kind",
            *(f"model.attention.{f}" for f in QUERY_SCALE),
        }
    )

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return global_nope_problems(self, super().part_problems(cfg), cfg)

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        no_bias = " (its gate_proj has no bias, and archlab's gate takes one with qkv_bias)"
        attention: list[Rule] = [
            ("model.attention.qk_norm", ("head",), " (it norms each head of q and k)"),
            ("model.attention.gate", ("elementwise",), " (its gate_proj gates every value dim)"),
            ("model.attention.gate_head_bias", (True,), " (gate_bias: one per head)"),
            ("model.attention.qkv_bias", (False,), no_bias),
            ("model.block.residual_rule", ("depth",), " (depth_scaled_residual_add)"),
        ]
        if is_dense(cfg):
            return attention
        return [
            *attention,
            ("model.mlp.expert", ("swiglu",), " (its experts are SwiGLU)"),
            ("model.mlp.bias", (False,), " (its MLPs have no biases)"),
            ("model.mlp.routing.scoring", ("sigmoid",), ""),
            ("model.mlp.routing.correction_bias", (True,), " (its router always has e_score_correction_bias)"),
            ("model.mlp.n_shared_experts", (0,), " (it has no shared experts)"),
        ]

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        """One window; RoPE on exactly the sliding layers; the NoPE layers' queries scaled as Beam's, the
        others' not; some MoE layer."""
        found = one_window(layers)
        for i, lc in enumerate(layers):
            kind, sliding, a = layer_kind(cfg, i), lc.attention.window is not None, lc.attention
            if (lc.position.kind == "rope") != sliding:
                wants = "rope" if sliding else "none"
                why = " (Beam rotates exactly its sliding layers)"
                found.append(Problem(kind_field(cfg, kind, "model.position.kind"), lc.position.kind, wants, why))
            wanted = {"query_scale_beta": None} if sliding else QUERY_SCALE
            why = (
                f" (Beam scales the queries of its {'full NoPE layers alone' if not sliding else 'NoPE layers alone'})"
            )
            for field, value in wanted.items():
                if getattr(a, field) != value:
                    name = kind_field(cfg, kind, f"model.attention.{field}")
                    found.append(Problem(name, getattr(a, field), fmt(value), why))
        if all(is_dense(lc) for lc in layers):
            found.append(Problem("model.mlp.kind", cfg.mlp.kind, "moe", " (some Beam layer is a MoE)"))
        return _unique(found)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        layers, m = layer_configs(cfg), cfg.mlp
        dense = [is_dense(lc) for lc in layers]
        rope_cfg = next((lc for lc in layers if lc.position.kind == "rope"), cfg)
        base = self.base_to_hf(cfg)
        for key in ("num_local_experts", "router_aux_loss_coef"):  # Beam names the count num_experts, has no aux
            del base[key]
        types = sliding_to_hf(cfg, layers)
        rope = {SLIDING: rope_to_hf(rope_cfg), FULL: None}
        return dict(
            base,
            hidden_act=GATED_TO_HF[activation(m)],
            intermediate_size=d_ff(cfg),
            moe_intermediate_size=expert_width(cfg),
            num_experts=m.routing.n_experts,
            norm_topk_prob=m.routing.normalize_top_k,
            n_group=m.routing.n_groups,
            topk_group=m.routing.top_groups,
            routed_scaling_factor=m.routing.routed_scale,
            mlp_layer_types=["dense" if d else "sparse" for d in dense],
            final_logit_softcapping=cfg.head.softcap,
            rope_parameters={t: rope[t] for t in set(types["layer_types"])},
            **types,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.attention_bias:
            refuse_hf(c, "attention_bias", "false (archlab's gate takes a bias with q/k/v; Beam's gate_proj has none)")
        types, params = checked_types(c), c.rope_parameters or {}
        if FULL in types and params.get(FULL) is not None:
            refuse_hf(c, "rope_parameters.full_attention", "null (archlab holds Beam's full layers without RoPE)")
        if SLIDING in types and not isinstance(params.get(SLIDING), dict):
            refuse_hf(c, "rope_parameters.sliding_attention", "the RoPE parameters of the sliding layers")
        if "sparse" not in c.mlp_layer_types:
            refuse_hf(c, "mlp_layer_types", "some 'sparse' layer (archlab's dense layers are kinds of a MoE model)")
        mlp = corrected_sigmoid_moe(c, c.num_experts)
        hd = config_head_dim(c)
        position = rope_from_hf(
            view(c, rope_parameters=params.get(SLIDING) or {"rope_type": "default"}), hd, partial=False
        )
        cfg = self.base_from_hf(c, position, mlp)
        cfg.block = BlockConfig(kind="sandwich", residual_rule="depth")
        cfg.attention.qk_norm, cfg.attention.gate, cfg.attention.gate_head_bias = "head", "elementwise", True
        cfg.head.softcap = None if c.final_logit_softcapping is None else float(c.final_logit_softcapping)
        dense = [t == "dense" for t in c.mlp_layer_types]
        names = [("sliding" if t == SLIDING else "full") + "_dense" * d for t, d in zip(types, dense)]
        overrides: dict[str, dict[str, dict[str, Any]]] = {
            "sliding": {"attention": {"window": c.sliding_window}},
            "full": {"position": {"kind": "none"}, "attention": dict(QUERY_SCALE)},
        }
        for name in list(overrides):
            overrides[f"{name}_dense"] = {**overrides[name], "mlp": {"kind": mlp.expert}}
        return apply_layout(cfg, names, overrides)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for lc, b, h in t.layers(**dict(SANDWICH)):
            a = f"{h}.self_attn"
            t.qkv(f"{b}.attn.qkv", a, False)
            t.add(f"{b}.attn.proj", f"{a}.o_proj")
            t.add(f"{b}.attn.gate", f"{a}.gate_proj")
            t.maps.append(TensorMap(f"{b}.attn.gate_head_bias", (f"{a}.gate_bias",)))
            t.add(f"{b}.attn.q_norm", f"{a}.q_norm")
            t.add(f"{b}.attn.k_norm", f"{a}.k_norm")
            mlp_tensors(t, lc, f"{b}.mlp", f"{h}.mlp")
        t.add("final_norm", "model.norm")
        return t.head()

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """transformers saves each routed expert apart: stacked as it loads them."""
        return stack_saved_experts(cfg, state)


RECORDS: tuple[Family, ...] = (Beam(),)
