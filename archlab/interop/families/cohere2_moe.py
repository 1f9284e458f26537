"""Cohere2-MoE (``cohere2_moe``): Cohere 2's layers (one norm feeding attention and MLP in parallel,
interleaved RoPE on the sliding layers, none on the full ones, q/k/v and o biases together, logits times
``logit_scale``) with a top-k mixture of experts, and dense gated MLPs where ``mlp_layer_types`` says. Read
into archlab's layer kinds ``sliding``, ``full`` and each ``_dense``; the dense full layers rotate too when
``prefix_dense_sliding_window_pattern`` is 1 (transformers' ``force_rope``). Nothing here imports
transformers."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from archlab.config import BlockConfig, ModelConfig, NormConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule, out_bias, ungrouped
from archlab.interop.families.experts import is_dense, mlp_tensors, stack_saved_experts
from archlab.interop.families.layered import rope_of
from archlab.interop.families.layered_moe import _LayeredSparse, _unique, apply_layout, one_window
from archlab.interop.families.mlps import GATED_TO_HF, activation, gated_activation, mlp_section
from archlab.interop.families.rope import rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import kind_field, refuse_hf
from archlab.interop.families.windows import SLIDING, checked_types, layer_types, sliding_window
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width


class Cohere2Moe(_LayeredSparse):
    """Cohere2MoeForCausalLM: a parallel block whose one ``input_layernorm`` is a LayerNorm without bias
    (``layer_norm_eps``) or, where ``rms_norm_eps`` is set, an RMSNorm; any ``head_dim``; RoPE on pairs
    interleaved on the sliding layers (and on the dense full ones where ``prefix_dense_sliding_window_pattern``
    is 1), none on the full ones; the logits times ``logit_scale`` (``model.head.logit_scale``). Its router
    takes the top-k logits, then a softmax over them (archlab's softmax scores renormalised over the top-k)
    or their sigmoids, renormalised as ``norm_topk_prob`` says; experts of ``intermediate_size`` beside
    ``num_shared_experts`` shared ones as one MLP, their outputs summed (the ``shared_expert_combination_strategy``
    'average', which halves the sum, is refused: archlab adds its shared experts' output); dense layers of
    ``prefix_dense_intermediate_size`` (else ``intermediate_size``) where ``mlp_layer_types`` says "dense"."""

    defers = True  # to Cohere, which holds its layouts with every layer dense and alike

    model_type, title, model_class, config_class = (
        "cohere2_moe",
        "Cohere2-MoE",
        "Cohere2MoeForCausalLM",
        "Cohere2MoeConfig",
    )
    parts = "Cohere 2's parallel layers (local RoPE / global NoPE, logit scale), top-k MoE with summed shared experts"
    features = frozenset(
        {
            "model.position.scaling.kind",
            "model.attention.window",
            "model.head.logit_scale",
            "model.layers.first",
            "model.layers.pattern",
        }
    )
    position_why = " (or none on its full layers)"
    block_kind = "parallel"
    pairing = "interleaved"
    varies = frozenset({"model.attention.window", "model.position.kind", "model.mlp.kind"})

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        norm: list[Rule] = [("model.norm.kind", ("layernorm", "rmsnorm"), "")]
        if cfg.norm.kind == "layernorm":
            norm.append(("model.norm.bias", (False,), " (its LayerNorm has no bias)"))
        return [
            *norm,
            ("model.block.kind", ("parallel",), ""),
            ("model.block.shared_norm", (True,), " (one input_layernorm feeds attention and MLP)"),
            NO_HEAD_BIAS,
            out_bias(cfg.attention.qkv_bias, " (one attention_bias flag sets q/k/v and o)"),
            ("model.position.pairing", ("interleaved",), ""),
            *self.family_rules(cfg),
        ]

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        if is_dense(cfg):
            return []  # its experts' kind: _LayeredSparse.part_problems, which has the model's
        m = cfg.mlp
        return [
            ("model.mlp.expert", ("swiglu", "geglu"), " (its experts are gated)"),
            ("model.mlp.bias", (False,), " (its MLPs have no biases)"),
            ("model.mlp.routing.correction_bias", (False,), ""),
            ("model.mlp.routing.scoring", ("softmax", "sigmoid"), " (its expert_selection_fn)"),
            ungrouped(),
            ("model.mlp.routing.routed_scale", (1.0,), ""),
            *(
                [("model.mlp.routing.normalize_top_k", (True,), " (its softmax runs over the top-k logits alone)")]
                if m.routing.scoring == "softmax"
                else []
            ),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        # the base rule wants rope on every layer: a full layer's none is held, and layout_problems says where
        found = [p for p in super().part_problems(cfg) if not (p.value == "none" and p.why == self.position_why)]
        return _unique(found + self.layout_problems(cfg, layer_configs(cfg)))

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        """One window; RoPE on every sliding layer, none on a full MoE layer, and the dense full layers all
        alike (with RoPE where prefix_dense_sliding_window_pattern is 1, else without)."""
        found = one_window(layers)
        dense_full = [lc.position.kind for lc in layers if lc.attention.window is None and is_dense(lc)]
        for i, lc in enumerate(layers):
            sliding, kind = lc.attention.window is not None, lc.position.kind
            if sliding:
                wants, why = "rope", f" ({self.title} rotates its sliding layers)"
            elif is_dense(lc):
                wants, why = dense_full[0], f" ({self.title}'s dense full layers all rotate or none does)"
            else:
                wants, why = "none", f" ({self.title}'s full MoE layers have no positions)"
            if kind != wants:
                found.append(Problem(kind_field(cfg, layer_kind(cfg, i), "model.position.kind"), kind, wants, why))
        return _unique(found)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        layers, m = layer_configs(cfg), cfg.mlp
        rope_cfg = next((lc for lc in layers if lc.position.kind == "rope"), cfg)
        dense = [lc for lc in layers if is_dense(lc)]
        moe = next((lc for lc in layers if not is_dense(lc)), cfg)
        kwargs = self.base_to_hf(cfg)
        for key in ("num_local_experts", "router_aux_loss_coef", "rms_norm_eps"):
            del kwargs[key]
        rms = cfg.norm.kind == "rmsnorm"
        types = layer_types(layers)
        rotating = any(lc.position.kind == "rope" for lc in dense if lc.attention.window is None)
        # where no dense full layer rotates, any period but 1 (layer_types is written: it sets no layer's type)
        period = 1 if rotating or not dense else cfg.n_layer + 1
        return dict(
            kwargs,
            hidden_act=GATED_TO_HF[activation(m)],
            intermediate_size=expert_width(moe),
            prefix_dense_intermediate_size=d_ff(dense[0]) if dense else None,
            num_experts=m.routing.n_experts,
            num_shared_experts=m.n_shared_experts,
            shared_expert_combination_strategy="sum",
            expert_selection_fn=m.routing.scoring,
            norm_topk_prob=m.routing.normalize_top_k,
            rms_norm_eps=cfg.norm.eps if rms else None,
            layer_norm_eps=1e-5 if rms else cfg.norm.eps,
            logit_scale=cfg.head.logit_scale,
            rope_parameters=rope_to_hf(rope_cfg),
            sliding_window=sliding_window(cfg, layers),
            layer_types=types,
            mlp_layer_types=["dense" if is_dense(lc) else "sparse" for lc in layers],
            prefix_dense_sliding_window_pattern=period,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        expert, approximate = gated_activation(c)
        if not c.num_experts:
            refuse_hf(c, "num_experts", "at least 1 (archlab's dense layers are kinds of a MoE model)")
        if c.num_shared_experts and c.shared_expert_combination_strategy != "sum":
            refuse_hf(
                c,
                "shared_expert_combination_strategy",
                "'sum' where num_shared_experts is set (archlab adds the shared experts' output; 'average' halves it)",
            )
        if c.expert_selection_fn not in ("softmax", "sigmoid"):
            refuse_hf(c, "expert_selection_fn", "'softmax' or 'sigmoid'")
        scale = c.logit_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            refuse_hf(c, "logit_scale", "a positive number (the logits are multiplied by it)")
        n, types = c.num_hidden_layers, checked_types(c)
        mlp_types = list(c.mlp_layer_types)
        if len(mlp_types) != n or set(mlp_types) - {"dense", "sparse"}:
            refuse_hf(c, "mlp_layer_types", f"{n} entries, each 'dense' or 'sparse'", mlp_types)
        softmax = c.expert_selection_fn == "softmax"
        mlp = mlp_section(
            "moe",
            expert=expert,
            approximate=approximate,
            bias=False,
            d_ff=c.prefix_dense_intermediate_size or c.intermediate_size,
            expert_d_ff=c.intermediate_size,
            n_shared_experts=c.num_shared_experts,
            routing=dict(
                n_experts=c.num_experts,
                top_k=c.num_experts_per_tok,
                scoring=c.expert_selection_fn,
                normalize_top_k=softmax or bool(c.norm_topk_prob),
            ),
        )
        position = rope_of(c, c.rope_parameters, c.head_dim)
        position.pairing = "interleaved"
        cfg = self.base_from_hf(c, position, mlp)
        if c.rms_norm_eps is None:
            cfg.norm = NormConfig(kind="layernorm", eps=c.layer_norm_eps, bias=False)
        cfg.block = BlockConfig(kind="parallel", shared_norm=True)
        cfg.head.logit_scale = float(scale)
        force_rope = c.prefix_dense_sliding_window_pattern == 1  # transformers' force_rope on dense layers
        overrides: dict[str, dict[str, dict[str, Any]]] = {
            "sliding": {"attention": {"window": c.sliding_window}},
            "full": {"position": {"kind": "none"}},
            "sliding_dense": {"attention": {"window": c.sliding_window}, "mlp": {"kind": expert}},
            "full_dense": {"mlp": {"kind": expert}}
            if force_rope
            else {"position": {"kind": "none"}, "mlp": {"kind": expert}},
        }
        names = [("sliding" if t == SLIDING else "full") + "_dense" * (m == "dense") for t, m in zip(types, mlp_types)]
        return apply_layout(cfg, names, overrides)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, bias = Tensors(cfg), cfg.attention.qkv_bias
        t.add("tok_emb", "model.embed_tokens")
        for i, lc in enumerate(layer_configs(cfg)):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm")
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", bias)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj", bias)
            mlp_tensors(t, lc, f"{b}.mlp", f"{h}.mlp")
        t.add("final_norm", "model.norm")
        return t.head()

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """transformers saves each routed expert apart: stacked as it loads them."""
        return stack_saved_experts(cfg, state)


RECORDS: tuple[Family, ...] = (Cohere2Moe(),)
