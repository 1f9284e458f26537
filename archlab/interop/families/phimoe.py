"""PhiMoE (``PhimoeForCausalLM``, Phi-3.5-MoE): Mixtral's layout with LayerNorms (a shift each), one
``attention_bias`` flag, an optional head bias (``lm_head_bias``), SparseMixer's top-2 routing
(``model.mlp.routing.sparsemixer_eps``: ``router_jitter_noise``) as transformers runs it at inference, and
LongRoPE as transformers' PhiMoE computes it (short factors at every length, ``short_mscale`` /
``long_mscale`` switching at the original context)."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import ONE_BIAS_FLAG, Family, Problem, Rule, out_bias
from archlab.interop.families.softmax_moe import _Softmax, replaced
from archlab.interop.families.tensors import TensorMap
from archlab.interop.families.values import refuse_hf
from archlab.nn.moe import expert_width
from archlab.nn.rope import attention_factor, long_attention_factor


def is_longrope(cfg: ModelConfig) -> bool:
    """Whether cfg's RoPE is scaled by LongRoPE."""
    return cfg.position.kind == "rope" and cfg.position.scaling.kind == "longrope"


NORMS = (("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm"))  # archlab's, HF's


class Phimoe(_Softmax):
    """PhimoeForCausalLM: pre-norm LayerNorm blocks (eps ``rms_norm_eps``), q/k/v and output biases together
    (``attention_bias``), full half-paired RoPE, GQA, a sliding window or none, a MoE in every layer of SwiGLU
    experts (``intermediate_size`` wide) routed by SparseMixer: two rounds, each the best expert left
    weighted by its softmax over the logits within 2·``router_jitter_noise`` (relative) of its own. Training
    mode's Gumbel sampling and input jitter (``input_jitter_noise``) are transformers' training alone.
    LongRoPE: transformers 5's PhiMoE recomputes the frequencies each forward without the sequence length, so
    its ``short_factor`` serves at every length (``model.position.scaling.switch_factors`` false; its
    ``long_factor`` travels unread), and scales cos and sin by ``short_mscale``
    (``model.position.scaling.attention_factor``) up to ``original_max_position_embeddings`` and by
    ``long_mscale`` (``long_attention_factor``) past it; rope_parameters' ``attention_factor`` is unread."""

    parts = "Mixtral's layers with LayerNorms, attention and head biases, SparseMixer top-2 routing, LongRoPE"

    model_type, title, model_class, config_class = "phimoe", "PhiMoE", "PhimoeForCausalLM", "PhimoeConfig"
    features = frozenset(
        {
            "model.position.scaling.kind",
            "model.position.scaling.short_factor",
            "model.position.scaling.long_factor",
            "model.position.scaling.attention_factor",
            "model.position.scaling.long_attention_factor",
            "model.position.scaling.switch_factors",
            "model.attention.window",
            "model.mlp.routing.sparsemixer_eps",
        }
    )
    scalings = ("none", "longrope")
    rope_keys = frozenset({"short_mscale", "long_mscale"})
    router = "router"
    expert_matrices = ("w1", "w3", "w2")
    checkpoint_renames = {".block_sparse_moe.": ".mlp.", ".mlp.gate.weight": ".mlp.router.weight"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        longrope = is_longrope(cfg)
        return replaced(
            super().rules(cfg),
            (
                "model.position.scaling.switch_factors",
                (not longrope,),
                " (transformers' PhiMoE keeps LongRoPE's short factors at every length)" if longrope else "",
            ),
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), " (its LayerNorms have a shift)"),
            ("model.head.bias", (False, True), ""),
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
            ("model.mlp.routing.top_k", (2,), " (SparseMixer chooses two experts)"),
            ("model.mlp.routing.router_bias", (False,), ""),
            (
                "model.attention.head_dim",
                (None, cfg.d_model // cfg.attention.n_head),
                " (PhiMoE uses d_model / n_head)",
            ),
        )

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        found = super().part_problems(cfg)
        r = cfg.mlp.routing if cfg.mlp.kind == "moe" else None
        if r is not None and r.sparsemixer_eps is None:
            found.append(Problem("model.mlp.routing.sparsemixer_eps", None, "a number", " (it routes by SparseMixer)"))
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        hf = dict(
            super().to_hf(cfg),
            num_local_experts=cfg.mlp.routing.n_experts,
            intermediate_size=expert_width(cfg),
            rms_norm_eps=cfg.norm.eps,
            router_jitter_noise=cfg.mlp.routing.sparsemixer_eps,
            attention_bias=cfg.attention.qkv_bias,
            lm_head_bias=cfg.head.bias,
        )
        if is_longrope(cfg):  # the mscales in place of the attention_factor PhiMoE never reads
            s = cfg.position.scaling
            rope = {k: v for k, v in hf["rope_parameters"].items() if k != "attention_factor"}
            hf["rope_parameters"] = dict(rope, short_mscale=attention_factor(s), long_mscale=long_attention_factor(s))
        return hf

    def from_hf(self, c: Any) -> ModelConfig:
        mlp = self.moe_from_hf(
            c,
            c.num_local_experts,
            c.intermediate_size,
            normalize_top_k=False,
            sparsemixer_eps=float(c.router_jitter_noise),
            aux_loss_weight=float(c.router_aux_loss_coef),
        )
        if c.num_experts_per_tok != 2:
            refuse_hf(c, "num_experts_per_tok", "2 (its SparseMixer chooses two experts whatever this says)")
        cfg = self.causal_from_hf(c, mlp)
        s = cfg.position.scaling
        if s.kind == "longrope":  # PhimoeConfig requires both mscales to be numbers
            s.switch_factors = False
            s.attention_factor = float(c.rope_parameters["short_mscale"])
            s.long_attention_factor = float(c.rope_parameters["long_mscale"])
        bias = bool(c.attention_bias)
        cfg.attention.qkv_bias, cfg.attention.out_bias = bias, bias
        cfg.norm.kind, cfg.norm.bias = "layernorm", True
        cfg.head.bias = bool(c.lm_head_bias)
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        """Mixtral's names, and the LayerNorms' shifts beside their scales."""
        norms = [
            (f"blocks.{i}.{ours}", f"model.layers.{i}.{theirs}") for i in range(cfg.n_layer) for ours, theirs in NORMS
        ]
        shifts = [
            TensorMap(f"{ours}.bias", (f"{theirs}.bias",)) for ours, theirs in [*norms, ("final_norm", "model.norm")]
        ]
        return super().tensors(cfg) + shifts


RECORDS: tuple[Family, ...] = (Phimoe(),)
