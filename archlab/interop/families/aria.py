"""Aria's text decoder (``AriaTextForCausalLM``): LLaMA's attention over softmax-routed experts beside shared
experts (the shared softmax-routed parts in ``softmax_moe``)."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import ONE_BIAS_FLAG, Family, Rule, out_bias
from archlab.interop.families.layered import view
from archlab.interop.families.softmax_moe import _Softmax, replaced
from archlab.interop.families.tensors import Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.base import head_dim
from archlab.nn.moe import expert_width


class AriaText(_Softmax):
    """AriaTextForCausalLM (Aria's text decoder): LLaMA's attention over a MoE in every layer whose router
    (``mlp.router``) softmaxes the top-k logits, which is softmax over every expert renormalised, beside
    ``moe_num_shared_experts`` shared experts of the routed width. Its experts are stored [E, in, out]
    (``gate_up_proj`` [E, d, 2f], gate columns first; ``down_proj`` [E, f, d]) and always SiLU-gated;
    its checkpoints name them ``experts.fc1`` and ``experts.fc2``."""

    defers = True  # to GraniteMoeShared, which holds its layouts with unit multipliers

    model_type, title, model_class, config_class = "aria_text", "Aria (text)", "AriaTextForCausalLM", "AriaTextConfig"
    parts = "LLaMA's layers with a softmax top-k MoE of SwiGLU experts ([E, in, out]) and shared experts"
    router = "router"
    checkpoint_renames = {
        ".mlp.experts.fc1.weight": ".mlp.experts.gate_up_proj",
        ".mlp.experts.fc2.weight": ".mlp.experts.down_proj",
    }

    shared_experts = True  # at least one: it builds the shared experts whatever their width

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        rules = [r for r in super().rules(cfg) if r[0] != "model.mlp.n_shared_experts"]
        return replaced(
            rules,
            ("model.mlp.expert", ("swiglu",), " (its experts are always SiLU-gated)"),
            ("model.mlp.routing.normalize_top_k", (True,), " (it softmaxes the top-k logits: the weights sum to 1)"),
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
        )

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        del kwargs["sliding_window"], kwargs["num_experts_per_tok"]  # no window; moe_topk is the top k
        return dict(
            kwargs,
            head_dim=head_dim(cfg),
            attention_bias=cfg.attention.qkv_bias,
            mlp_bias=False,
            intermediate_size=expert_width(cfg),
            moe_num_experts=cfg.mlp.routing.n_experts,
            moe_topk=cfg.mlp.routing.top_k,
            moe_num_shared_experts=cfg.mlp.n_shared_experts,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.hidden_act != "silu":
            refuse_hf(c, "hidden_act", "'silu' (its routed experts are SiLU-gated whatever it says)")
        if c.mlp_bias:
            refuse_hf(c, "mlp_bias", "false (it biases the shared experts but not the routed ones)")
        if c.moe_num_shared_experts < 1:
            refuse_hf(c, "moe_num_shared_experts", "at least 1 (it builds the shared experts whatever their width)")
        c = view(c, sliding_window=None, num_experts_per_tok=c.moe_topk)
        mlp = self.moe_from_hf(
            c, c.moe_num_experts, c.intermediate_size, n_shared_experts=c.moe_num_shared_experts, normalize_top_k=True
        )
        cfg = self.causal_from_hf(c, mlp)
        bias = bool(c.attention_bias)
        cfg.attention.qkv_bias, cfg.attention.out_bias = bias, bias
        return cfg

    def mlp_tensors(self, t: Tensors, lc: ModelConfig, archlab: str, hf: str) -> None:
        super().mlp_tensors(t, lc, archlab, hf)
        experts = (f"{archlab}.experts.gate_up", f"{archlab}.experts.down")
        t.maps = [m._replace(layout="experts_transposed") if m.archlab in experts else m for m in t.maps]


RECORDS: tuple[Family, ...] = (AriaText(),)
