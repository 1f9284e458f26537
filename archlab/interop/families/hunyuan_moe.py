"""HunYuan MoE (``HunYuanMoEV1ForCausalLM``): HunYuan dense's attention over softmax-routed experts beside one
shared expert (the shared softmax-routed parts in ``softmax_moe``)."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import ONE_BIAS_FLAG, Family, Rule, out_bias
from archlab.interop.families.hunyuan import HunYuanDense
from archlab.interop.families.layered import view
from archlab.interop.families.softmax_moe import _Softmax, replaced, uniform
from archlab.interop.families.tensors import Tensors
from archlab.interop.families.values import config_head_dim
from archlab.nn.mixers.base import head_dim
from archlab.nn.moe import expert_width


class HunYuanMoe(_Softmax):
    """HunYuanMoEV1ForCausalLM: HunYuan dense's attention (q/k/v and output biases together, a per-head
    RMSNorm of the rotated q and k as ``query_layernorm`` and ``key_layernorm``, the fixed-alpha NTK base
    read as ``HunYuanDense`` does) over a MoE in every layer: ``num_experts`` experts of
    ``intermediate_size`` (``mlp.gate.wg`` routes, softmax, top-k renormalised) beside one shared expert
    of the same width (``mlp.shared_mlp``)."""

    model_type, title = "hunyuan_v1_moe", "HunYuan-MoE"
    model_class, config_class = "HunYuanMoEV1ForCausalLM", "HunYuanMoEV1Config"
    features = frozenset(
        {"model.position.scaling.kind", "model.attention.qk_norm", "model.attention.qk_norm_after_rope"}
    )
    parts = "HunYuan dense's layers (per-head QK-norm after RoPE) with a softmax top-k MoE and one shared expert"
    router, shared = "gate.wg", "mlp.shared_mlp"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return replaced(
            super().rules(cfg),
            ("model.mlp.n_shared_experts", (1,), " (its MoE layers have one shared expert of the routed width)"),
            ("model.mlp.routing.normalize_top_k", (True,), " (it always renormalises the top-k weights)"),
            ("model.attention.qk_norm", ("head",), " (query_layernorm and key_layernorm span one head)"),
            ("model.attention.qk_norm_after_rope", (True,), " (HunYuan norms the rotated q and k)"),
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
        )

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        del kwargs["sliding_window"]  # its attention has none
        return dict(
            kwargs,
            head_dim=head_dim(cfg),
            attention_bias=cfg.attention.qkv_bias,
            num_experts=cfg.mlp.routing.n_experts,
            moe_topk=cfg.mlp.routing.top_k,
            intermediate_size=expert_width(cfg),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        hd = config_head_dim(c)
        rope = HunYuanDense._fixed_rope(c, hd)
        c = view(c, rope_parameters=rope, sliding_window=None, num_experts_per_tok=uniform(c, "moe_topk"))
        mlp = self.moe_from_hf(c, uniform(c, "num_experts"), c.intermediate_size, n_shared_experts=1)
        cfg = self.causal_from_hf(c, mlp)
        bias = bool(c.attention_bias)
        cfg.attention.qkv_bias, cfg.attention.out_bias = bias, bias
        cfg.attention.qk_norm, cfg.attention.qk_norm_after_rope = "head", True
        return cfg

    def attention_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        a = t.cfg.attention
        t.qkv(f"{archlab}.qkv", hf, a.qkv_bias)
        t.add(f"{archlab}.q_norm", f"{hf}.query_layernorm")
        t.add(f"{archlab}.k_norm", f"{hf}.key_layernorm")
        t.add(f"{archlab}.proj", f"{hf}.o_proj", a.out_bias)


RECORDS: tuple[Family, ...] = (HunYuanMoe(),)
