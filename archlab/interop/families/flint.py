"""Flint (``FlintForCausalLM``): Qwen3-MoE's attention with gpt-oss's sinks over sigmoid top-k without a
correction bias, its sliding layers rotating and its full layers without positions
(``global_nope_moe._GlobalNope``). Its checkpoints name the sinks ``self_attn.softmax_offset``."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs
from archlab.interop.families.base import Family, Rule, ungrouped
from archlab.interop.families.experts import (
    dense_tensors,
    is_dense,
)
from archlab.interop.families.global_nope_moe import _GlobalNope
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.moe import expert_width


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


RECORDS: tuple[Family, ...] = (Flint(),)
