"""EXAONE MoE (``ExaoneMoeForCausalLM``, K-EXAONE): DeepSeek-V3's router under EXAONE 4's attention, its
sliding layers rotating and its full layers without positions (``global_nope_moe._GlobalNope``). Its
checkpoints name the correction bias ``mlp.e_score_correction_bias`` (without the ``gate``) and hold
multi-token-prediction tensors (``mtp.*``), which transformers leaves out, as archlab does."""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs
from archlab.interop.families.base import Family, Rule
from archlab.interop.families.experts import (
    dense_first,
    is_dense,
)
from archlab.interop.families.global_nope_moe import _GlobalNope
from archlab.interop.families.layered import view
from archlab.interop.families.values import refuse_hf
from archlab.interop.families.windows import SLIDING


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


RECORDS: tuple[Family, ...] = (ExaoneMoe(),)
