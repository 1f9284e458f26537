"""OLMoE and FlexOlmo: LLaMA's layers with a whole-projection QK-norm over softmax-routed experts, FlexOlmo's in
OLMo 2's block (the shared softmax-routed parts in ``softmax_moe``), and OLMoE's rules, keys and reading, which
both state."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import ONE_BIAS_FLAG, Family, Rule, out_bias
from archlab.interop.families.layered import view
from archlab.interop.families.phi3 import fixed_head_dim, head_dim_rule
from archlab.interop.families.softmax_moe import _Softmax, replaced
from archlab.interop.families.tensors import TensorMap
from archlab.interop.families.values import refuse_hf
from archlab.nn.moe import expert_width

FEATURES = frozenset({"model.position.scaling.kind", "model.attention.qk_norm"})


def olmoe_rules(cfg: ModelConfig, title: str) -> list[Rule]:
    """What OLMoE's attention requires beyond the softmax records' rules: the QK-norm over the projection,
    one bias flag, head_dim = hidden_size / heads."""
    return [
        ("model.attention.qk_norm", ("full",), " (q_norm and k_norm span the projection)"),
        out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
        head_dim_rule(cfg, title),
    ]


def olmoe_to_hf(kwargs: dict[str, Any], cfg: ModelConfig) -> dict[str, Any]:
    """The softmax records' keys ``kwargs`` as OLMoE's: no window, its bias flag, experts and renormalisation."""
    del kwargs["sliding_window"]  # its attention has none
    return dict(
        kwargs,
        attention_bias=cfg.attention.qkv_bias,
        num_experts=cfg.mlp.routing.n_experts,
        intermediate_size=expert_width(cfg),
        norm_topk_prob=cfg.mlp.routing.normalize_top_k,
    )


def olmoe_from_hf(family: _Softmax, c: Any) -> ModelConfig:
    """archlab's config of an OLMoE config (FlexOlmo's too, in pre-norm blocks)."""
    if getattr(c, "clip_qkv", None) is not None:
        refuse_hf(c, "clip_qkv", "null (it clamps after the QK-norm; archlab's clip_qkv clamps before it)")
    fixed_head_dim(c)
    mlp = family.moe_from_hf(
        c,
        c.num_experts,
        c.intermediate_size,
        normalize_top_k=bool(c.norm_topk_prob),
        aux_loss_weight=float(c.router_aux_loss_coef),
    )
    cfg = family.causal_from_hf(view(c, sliding_window=None, head_dim=None), mlp)
    bias = bool(c.attention_bias)
    cfg.attention.qkv_bias, cfg.attention.out_bias, cfg.attention.qk_norm = bias, bias, "full"
    cfg.attention.head_dim = None
    return cfg


class Olmoe(_Softmax):
    """OlmoeForCausalLM: LLaMA's layers with q and k RMSNormed over the whole projection before RoPE, a
    MoE in every layer renormalised as ``norm_topk_prob`` says, head_dim = hidden_size / heads. Its
    ``clip_qkv`` clamps q, k and v after the QK-norm; archlab clamps the projection before it, so a
    clip_qkv is refused."""

    model_type, title, model_class, config_class = "olmoe", "OLMoE", "OlmoeForCausalLM", "OlmoeConfig"
    features = FEATURES
    parts = "LLaMA's layers with a QK RMSNorm over the projection, a softmax top-k MoE"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + olmoe_rules(cfg, self.title)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return olmoe_to_hf(super().to_hf(cfg), cfg)

    def from_hf(self, c: Any) -> ModelConfig:
        return olmoe_from_hf(self, c)


class FlexOlmo(_Softmax):
    """FlexOlmoForCausalLM: OLMoE's attention (no clip_qkv) and MoE in OLMo 2's block: each sublayer's
    output RMSNormed before the residual add, no norm before a sublayer."""

    model_type, title, model_class, config_class = "flex_olmo", "FlexOlmo", "FlexOlmoForCausalLM", "FlexOlmoConfig"
    features = FEATURES
    parts = "OLMo 2's post_sublayer block and QK RMSNorm over the projection, a softmax top-k MoE"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        rules = super().rules(cfg) + olmoe_rules(cfg, self.title)
        return replaced(rules, ("model.block.kind", ("post_sublayer",), ""))

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return olmoe_to_hf(super().to_hf(cfg), cfg)

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = olmoe_from_hf(self, c)
        cfg.block.kind = "post_sublayer"
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        """``_Softmax.tensors`` with OLMo 2's norms: after attention and after the MoE, none before."""
        ours = {".attn_norm.": ".attn_out_norm.", ".mlp_norm.": ".mlp_out_norm."}
        theirs = {".attn_norm.": ".post_attention_layernorm.", ".mlp_norm.": ".post_feedforward_layernorm."}
        maps = []
        for m in super().tensors(cfg):
            old = next((k for k in ours if k in m.archlab), None)
            if old is not None:
                layer = m.hf[0].rsplit(".", 2)[0]  # model.layers.i
                m = TensorMap(m.archlab.replace(old, ours[old]), (f"{layer}{theirs[old]}weight",))
            maps.append(m)
        return maps


RECORDS: tuple[Family, ...] = (
    Olmoe(),
    FlexOlmo(),
)
