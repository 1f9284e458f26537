"""ERNIE 4.5 MoE (``Ernie4_5_MoeForCausalLM``): ERNIE 4.5's layers over softmax routing with a selection-only
correction bias, shared experts and dense first layers (the shared softmax-routed parts in ``softmax_moe``)."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs
from archlab.interop.families.base import LAYERS, Family, Rule, out_bias
from archlab.interop.families.experts import dense_first, with_dense_first
from archlab.interop.families.layered import view
from archlab.interop.families.softmax_moe import _Softmax, replaced
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.moe import expert_width


class Ernie45Moe(_Softmax):
    """Ernie4_5_MoeForCausalLM: ERNIE 4.5's layers (interleaved RoPE, no attention dropout, no biases)
    over softmax routing whose top k are chosen by the scores plus a selection-only correction bias
    (``mlp.gate.moe_statics.e_score_correction_bias``, [1, E]), renormalised, beside
    ``moe_num_shared_experts`` shared experts; the layers before ``moe_layer_start_index`` dense (width
    ``intermediate_size``). ``use_bias`` biases the attention, the shared experts and the dense MLPs but
    not the routed experts, which archlab's one ``model.mlp.bias`` cannot hold: it is refused."""

    model_type, title = "ernie4_5_moe", "ERNIE 4.5 MoE"
    model_class, config_class = "Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig"
    features = frozenset({"model.position.scaling.kind"}) | LAYERS
    checkpoint_renames = {".mlp.moe_statics.": ".mlp.gate.moe_statics."}  # as saved, the bias beside the router
    parts = "ERNIE 4.5's layers with a softmax top-k MoE, correction bias, shared experts, dense first layers"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            r
            for r in replaced(
                super().rules(cfg),
                ("model.position.pairing", ("interleaved",), " (ERNIE 4.5 rotates adjacent dims together)"),
                ("model.mlp.routing.correction_bias", (True,), " (its router always has e_score_correction_bias)"),
                ("model.mlp.routing.normalize_top_k", (True,), " (it always renormalises the top-k weights)"),
                ("model.attention.qkv_bias", (False,), " (use_bias would bias its shared experts too)"),
                out_bias(False),
                ("model.attention.dropout", (0.0,), " (ERNIE 4.5's attention has no dropout)"),
            )
            if r[0] != "model.mlp.n_shared_experts"
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        for key in ("sliding_window", "attention_dropout", "num_experts_per_tok"):
            del kwargs[key]  # Ernie4_5_MoeConfig has no window or attention dropout; moe_k is the top k
        n_dense = dense_first(layer_configs(cfg))
        return dict(
            kwargs,
            head_dim=head_dim(cfg),
            use_bias=False,
            intermediate_size=d_ff(cfg),
            moe_intermediate_size=expert_width(cfg),
            moe_k=cfg.mlp.routing.top_k,
            moe_num_experts=cfg.mlp.routing.n_experts,
            moe_num_shared_experts=cfg.mlp.n_shared_experts,
            moe_layer_start_index=n_dense,
            moe_layer_end_index=cfg.n_layer - 1,
            moe_layer_interval=1,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.use_bias:
            refuse_hf(c, "use_bias", "false (it biases the shared experts but not the routed ones)")
        if c.moe_layer_interval != 1:
            refuse_hf(c, "moe_layer_interval", "1 (archlab's MoE layers are every layer after the dense ones)")
        end = c.moe_layer_end_index
        if end != -1 and end < c.num_hidden_layers - 1:
            refuse_hf(
                c, "moe_layer_end_index", f"-1 or at least {c.num_hidden_layers - 1} (MoE through the last layer)"
            )
        c = view(c, sliding_window=None, attention_dropout=0.0, num_experts_per_tok=c.moe_k)
        mlp = self.moe_from_hf(
            c,
            c.moe_num_experts,
            c.moe_intermediate_size,
            d_ff=c.intermediate_size,
            n_shared_experts=c.moe_num_shared_experts or 0,
            correction_bias=True,
            normalize_top_k=True,
            aux_loss_weight=float(c.router_aux_loss_coef or 0.0),
        )
        cfg = self.causal_from_hf(c, mlp)
        cfg.position.pairing = "interleaved"
        return with_dense_first(cfg, min(max(c.moe_layer_start_index, 0), c.num_hidden_layers))


RECORDS: tuple[Family, ...] = (Ernie45Moe(),)
