"""Two Hugging Face MoE families whose sliding layers rotate and whose full layers have no positions, in
pre-norm blocks with a per-head QK-norm before RoPE, sigmoid routing, shared experts and dense layers
where a per-layer list puts them: EXAONE MoE (K-EXAONE: DeepSeek-V3's router under EXAONE 4's attention)
and Flint (Qwen3-MoE's attention with gpt-oss's sinks, sigmoid top-k without a correction bias).

Both are ``layered_moe.Afmoe``'s layout less its sandwich block, output gate and μP embedding scale
(``_GlobalNope``): the same layer kinds (``sliding``, ``full`` and each ``_dense``), the same rule that
exactly the sliding layers rotate, but dense layers anywhere (transformers' ``mlp_layer_types`` and
``mlp_only_layers`` name any layer, and archlab's layer kinds hold any order). Their checkpoints save each
expert apart (stacked on loading) and keep names that transformers renames as it loads: EXAONE MoE's
``mlp.e_score_correction_bias`` (without the ``gate``) and Flint's ``self_attn.softmax_offset``; EXAONE
MoE's multi-token-prediction tensors (``mtp.*``), which transformers leaves out, are left out too.
Nothing here imports transformers."""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.interop.families.afmoe import Afmoe
from archlab.interop.families.base import Family, Problem, Rule, ungrouped
from archlab.interop.families.experts import (
    dense_first,
    dense_tensors,
    is_dense,
    mlp_tensors,
    pre_norm_tensors,
    stack_saved_experts,
)
from archlab.interop.families.layered import view
from archlab.interop.families.layered_moe import _unique, apply_layout, one_window
from archlab.interop.families.mlps import GATED_TO_HF, activation, gated_activation, mlp_section
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, kind_field, refuse_hf
from archlab.interop.families.windows import SLIDING, checked_types, layer_types, sliding_window
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width


class _GlobalNope(Afmoe):
    """What EXAONE MoE and Flint share: AFMoE's layer kinds (sliding layers with RoPE, full ones without
    positions, each ``_dense`` where the layer holds a gated MLP of ``intermediate_size``) in pre-norm
    blocks (``input_layernorm``, ``post_attention_layernorm``), q and k RMSNormed per head before RoPE, no
    output gate, unscaled embeddings, and sigmoid top-k routing beside shared experts on the MoE layers."""

    block_kind = "pre"
    features = Afmoe.features - {"model.scale_embedding", "model.attention.gate"}

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        attention: list[Rule] = [
            ("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head, before RoPE)"),
            *self.attention_rules(cfg),
        ]
        if is_dense(cfg):  # a dense layer: the experts' kind, no biases
            return attention  # its experts' kind: _LayeredSparse.part_problems, which has the model's
        return [
            *attention,
            ("model.mlp.expert", ("swiglu", "geglu"), " (its experts are gated)"),
            ("model.mlp.bias", (False,), " (its MLPs have no biases)"),
            ("model.mlp.routing.scoring", ("sigmoid",), ""),
            *self.routing_rules(cfg),
            *self.shared_rules(cfg),
        ]

    def attention_rules(self, cfg: ModelConfig) -> list[Rule]:
        return []

    def routing_rules(self, cfg: ModelConfig) -> list[Rule]:
        return []

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        """One window for the sliding layers; RoPE on exactly those, no positions on the full ones."""
        found = one_window(layers)
        for i, lc in enumerate(layers):
            sliding, kind = lc.attention.window is not None, lc.position.kind
            if kind in ("rope", "none") and (kind == "rope") != sliding:
                field = kind_field(cfg, layer_kind(cfg, i), "model.position.kind")
                why = f" ({self.title} rotates exactly its sliding layers; its full layers have no positions)"
                found.append(Problem(field, kind, "rope" if sliding else "none", why))
        return _unique(found)

    def layers_to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        """The keys both configs name alike: the layers' kinds (every key a strict int: the context where
        no layer slides), RoPE of a rotating layer, the MLP widths and expert counts."""
        layers, m = layer_configs(cfg), cfg.mlp
        rope_cfg = next((lc for lc in layers if lc.position.kind == "rope"), cfg)
        moe = next((lc for lc in layers if not is_dense(lc)), cfg)
        kwargs = self.base_to_hf(cfg)
        del kwargs["num_local_experts"]  # both name the count num_experts
        return dict(
            kwargs,
            hidden_act=GATED_TO_HF[activation(m)],
            intermediate_size=d_ff(cfg),
            moe_intermediate_size=expert_width(moe),
            num_experts=m.routing.n_experts,
            norm_topk_prob=m.routing.normalize_top_k,
            rope_parameters=rope_to_hf(rope_cfg),
            sliding_window=sliding_window(cfg, layers),
            layer_types=layer_types(layers),
        )

    def laid_out(self, c: Any, mlp: Any, dense: list[bool]) -> ModelConfig:
        """archlab's config of the HF config ``c`` (its ``attention_bias`` read, or a ``view`` giving it),
        the MoE ``mlp`` on every layer but those ``dense`` marks: each layer's kind by its type and MLP."""
        hd = config_head_dim(c)
        cfg = self.base_from_hf(c, rope_from_hf(c, hd, partial=False), mlp)
        cfg.attention.qk_norm = "head"
        names = [("sliding" if t == SLIDING else "full") + "_dense" * d for t, d in zip(checked_types(c), dense)]
        overrides: dict[str, dict[str, dict[str, Any]]] = {
            "sliding": {"attention": {"window": c.sliding_window}},
            "full": {"position": {"kind": "none"}},
        }
        for name in list(overrides):
            overrides[f"{name}_dense"] = {**overrides[name], "mlp": {"kind": mlp.expert}}
        return apply_layout(cfg, names, overrides)

    @staticmethod
    def moe_from_hf(c: Any, **fields: Any) -> Any:
        """The MoE both read alike: gated experts of ``hidden_act`` without biases, sigmoid scores, the
        top-k renormalised as ``norm_topk_prob`` says; ``fields`` the family's own."""
        expert, approximate = gated_activation(c)
        if not c.num_experts:
            refuse_hf(c, "num_experts", "at least 1 (archlab's dense layers are kinds of a MoE model)")
        return mlp_section(
            "moe",
            expert=expert,
            approximate=approximate,
            bias=False,
            d_ff=c.intermediate_size,
            expert_d_ff=c.moe_intermediate_size,
            **fields,
            routing=dict(
                n_experts=c.num_experts,
                top_k=c.num_experts_per_tok,
                scoring="sigmoid",
                normalize_top_k=bool(c.norm_topk_prob),
            ),
        )

    def attention(self, t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
        bias = t.cfg.attention.qkv_bias
        t.qkv(f"{archlab}.qkv", hf, bias)
        t.add(f"{archlab}.q_norm", f"{hf}.q_norm")
        t.add(f"{archlab}.k_norm", f"{hf}.k_norm")
        t.add(f"{archlab}.proj", f"{hf}.o_proj", bias)

    def mlp(self, t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
        mlp_tensors(t, lc, archlab, hf)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        return pre_norm_tensors(cfg, self.attention, self.mlp)

    checkpoint_renames: tuple[tuple[str, str], ...] = ()  # (pattern, replacement): its checkpoints' names

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The checkpoint's names as transformers renames them on loading, each expert stacked."""
        for old, new in self.checkpoint_renames:
            state = {re.sub(old, new, k): v for k, v in state.items()}
        return stack_saved_experts(cfg, state)


class ExaoneMoe(_GlobalNope):
    """ExaoneMoeForCausalLM (K-EXAONE): EXAONE 4's attention (no biases, per-head QK-norm) in pre-norm
    blocks; the ``sliding_attention`` layers (``layer_types``) with a window and RoPE, the full ones
    without positions (EXAONE 4's rule with a window set: ExaoneMoeConfig requires one). DeepSeek-V3's MoE
    where ``mlp_layer_types`` says "sparse": sigmoid scores plus the selection-only
    ``e_score_correction_bias``, groups ranked by their two best (``n_group``, ``topk_group``), the top-k
    renormalised as ``norm_topk_prob`` says, times ``routed_scaling_factor``, beside ``num_shared_experts``
    shared experts as one MLP; a dense gated MLP of ``intermediate_size`` where it says "dense"."""

    parts = "EXAONE 4's attention in pre-norm blocks, local RoPE / global NoPE layers, DeepSeek-V3's sigmoid MoE, dense layers by mlp_layer_types"

    model_type, title, model_class, config_class = "exaone_moe", "EXAONE MoE", "ExaoneMoeForCausalLM", "ExaoneMoeConfig"
    checkpoint_renames = ((r"\.mlp\.e_score_correction_bias$", ".mlp.gate.e_score_correction_bias"),)

    def attention_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [("model.attention.qkv_bias", (False,), " (EXAONE MoE has no attention biases)")]

    def routing_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [("model.mlp.routing.correction_bias", (True,), " (its router always has e_score_correction_bias)")]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        m, layers = cfg.mlp, layer_configs(cfg)
        kwargs = self.layers_to_hf(cfg)
        for key in ("attention_bias", "router_aux_loss_coef"):  # ExaoneMoeConfig has neither
            del kwargs[key]
        types = kwargs["layer_types"]
        period = types.index("full_attention") + 1 if "full_attention" in types else None
        regular = period is not None and all((t == SLIDING) == bool((i + 1) % period) for i, t in enumerate(types))
        return dict(
            kwargs,
            num_shared_experts=m.n_shared_experts,
            routed_scaling_factor=m.routing.routed_scale,
            n_group=m.routing.n_groups,
            topk_group=m.routing.top_groups,
            mlp_layer_types=["dense" if is_dense(lc) else "sparse" for lc in layers],
            first_k_dense_replace=dense_first(layers),  # unread beside mlp_layer_types
            sliding_window_pattern=period if regular else None,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.sliding_window is None:
            refuse_hf(
                c, "sliding_window", "a window (ExaoneMoeConfig requires one; with it the full layers have no RoPE)"
            )
        if not c.num_shared_experts:
            refuse_hf(
                c, "num_shared_experts", "at least 1 (archlab's shared experts are one MLP of n·moe_intermediate_size)"
            )
        types = list(c.mlp_layer_types)  # ExaoneMoeConfig checks: one "dense" or "sparse" per layer
        mlp = self.moe_from_hf(
            c,
            n_shared_experts=c.num_shared_experts,
            correction_bias=True,
            n_groups=c.n_group or 1,
            top_groups=c.topk_group or 1,
            routed_scale=float(c.routed_scaling_factor),
        )
        return self.laid_out(view(c, attention_bias=False), mlp, [t == "dense" for t in types])

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Without the multi-token-prediction tensors (``mtp.*``, which transformers ignores on loading),
        the correction bias renamed into the ``gate``, each expert stacked."""
        kept = {k: v for k, v in state.items() if not re.search(r"(^|\.)mtp\.", k)}
        return super().from_checkpoint(cfg, kept)


class Flint(_GlobalNope):
    """FlintForCausalLM: Qwen3-MoE's attention (per-head QK-norm before RoPE, q/k/v and o biases together
    by ``attention_bias``) with a learned sink logit per head (``sinks``), RoPE and the window on the
    ``sliding_attention`` layers, no positions on the full ones; on the layers that neither
    ``mlp_only_layers`` names nor ``decoder_sparse_step`` skips, sigmoid top-k over the router's logits
    (no correction bias, no groups, unscaled), renormalised as ``norm_topk_prob`` says, beside one gated
    ``shared_expert`` of ``shared_expert_intermediate_size`` (archlab's shared experts: a multiple of
    ``moe_intermediate_size``); a dense gated MLP of ``intermediate_size`` on the others."""

    parts = "Qwen3-MoE's attention with sinks, local RoPE / global NoPE layers, sigmoid MoE with a shared expert, dense layers by mlp_only_layers"

    model_type, title, model_class, config_class = "flint", "Flint", "FlintForCausalLM", "FlintConfig"
    features = _GlobalNope.features | {"model.attention.sinks"}
    checkpoint_renames = ((r"\.self_attn\.softmax_offset$", ".self_attn.sinks"),)

    def attention_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [("model.attention.sinks", (True,), " (every head has a sink logit)")]

    def routing_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.mlp.routing.correction_bias", (False,), " (its router has no correction bias)"),
            ungrouped(" (it routes without groups)"),
            ("model.mlp.routing.routed_scale", (1.0,), " (its routing weights are unscaled)"),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        layers = layer_configs(cfg)
        moe = next((lc for lc in layers if not is_dense(lc)), cfg)
        return dict(
            self.layers_to_hf(cfg),
            shared_expert_intermediate_size=cfg.mlp.n_shared_experts * expert_width(moe),
            mlp_only_layers=[i for i, lc in enumerate(layers) if is_dense(lc)],
            decoder_sparse_step=1,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        f, shared, step = c.moe_intermediate_size, c.shared_expert_intermediate_size, c.decoder_sparse_step
        if not shared or shared % f:
            refuse_hf(
                c,
                "shared_expert_intermediate_size",
                f"a positive multiple of moe_intermediate_size={f} (archlab's shared experts are one MLP of "
                "n·moe_intermediate_size)",
            )
        if not step or step < 1:
            refuse_hf(c, "decoder_sparse_step", "at least 1")
        only = set(c.mlp_only_layers or [])
        dense = [i in only or (i + 1) % step != 0 for i in range(c.num_hidden_layers)]
        mlp = self.moe_from_hf(c, n_shared_experts=shared // f, aux_loss_weight=float(c.router_aux_loss_coef))
        cfg = self.laid_out(c, mlp, dense)
        cfg.attention.sinks = True
        return cfg

    def attention(self, t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
        super().attention(t, lc, archlab, hf)
        t.maps.append(TensorMap(f"{archlab}.sinks", (f"{hf}.sinks",)))

    def mlp(self, t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
        """A dense layer's MLP; else the router, the stacked experts and the one ``shared_expert``."""
        if is_dense(lc):
            dense_tensors(t, lc, archlab, hf)
            return
        f, s = lc.mlp.n_shared_experts * expert_width(lc), f"{hf}.shared_expert"
        t.add(f"{archlab}.router", f"{hf}.gate")
        t.maps.append(TensorMap(f"{archlab}.experts.gate_up", (f"{hf}.experts.gate_up_proj",)))
        t.maps.append(TensorMap(f"{archlab}.experts.down", (f"{hf}.experts.down_proj",)))
        t.stacked(f"{archlab}.shared.gate_up", [f"{s}.gate_proj", f"{s}.up_proj"], False, (f, f))
        t.add(f"{archlab}.shared.down", f"{s}.down_proj")


RECORDS: tuple[Family, ...] = (ExaoneMoe(), Flint())
