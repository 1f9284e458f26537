"""gpt-oss (``GptOssForCausalLM``): the layered mixture of experts with sliding and full layers, attention sinks and clamped SwiGLU experts (helpers in ``layered_moe``)."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    ModelConfig,
)
from archlab.config.layers import layer_configs
from archlab.interop.families.base import Family, Problem, Rule, ungrouped
from archlab.interop.families.layered_moe import (
    _LayeredSparse,
    apply_layout,
    one_window,
)
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, refuse_hf
from archlab.interop.families.windows import checked_types, sliding_to_hf
from archlab.nn.moe import expert_width


class GptOss(_LayeredSparse):
    """GptOssForCausalLM: q/k/v and o with biases (``attention_bias``), a learned sink logit per head,
    sliding-window or full attention per layer (``layer_types``, one ``sliding_window``), and a MoE in
    every layer: a router with a bias, softmax over the top-k logits, experts with biases and the clamped
    SwiGLU (up + 1)·g·σ(α·g) with the gate bounded by ``swiglu_limit`` and up clamped to it. RoPE halves,
    unscaled or transformers' generic YaRN: cos and sin times the attention factor, the softmax scale
    untouched (archlab's yarn without ``mscale``s), the band's ends rounded outward or not (``truncate``: false
    in the published configs and GptOssConfig's default)."""

    parts = "sinks, local/global layers, biased attention, a clamped SwiGLU MoE with router bias, YaRN"

    model_type, title, model_class, config_class = "gpt_oss", "gpt-oss", "GptOssForCausalLM", "GptOssConfig"
    features = frozenset(
        {
            "model.position.scaling.kind",
            "model.position.scaling.truncate",
            "model.attention.window",
            "model.attention.sinks",
            "model.mlp.swiglu_limit",
            "model.mlp.swiglu_alpha",
            "model.mlp.up_offset",
            "model.mlp.routing.router_bias",
            "model.layers.first",
            "model.layers.pattern",
        }
    )
    scalings = ("none", "yarn")
    varies = frozenset({"model.attention.window"})

    def family_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.attention.sinks", (True,), " (every head has a sink logit)"),
            ("model.mlp.kind", ("moe",), " (every layer is a MoE)"),
            ("model.mlp.expert", ("swiglu",), " (its experts are clamped SwiGLUs)"),
            ("model.mlp.bias", (True,), " (its experts have biases)"),
            ("model.mlp.routing.router_bias", (True,), " (its router has a bias)"),
            ("model.mlp.routing.scoring", ("softmax",), ""),
            ("model.mlp.routing.normalize_top_k", (True,), " (a softmax over the top-k logits)"),
            ("model.mlp.routing.correction_bias", (False,), ""),
            ungrouped(""),
            ("model.mlp.routing.routed_scale", (1.0,), ""),
            ("model.mlp.n_shared_experts", (0,), " (it has no shared experts)"),
            ("model.mlp.routing.weight_input", (False,), ""),
            ("model.mlp.swiglu_clamp", ("gate",), " (it bounds the gate before the activation)"),
            ("model.mlp.up_offset", (1.0,), " (its SwiGLU adds 1 to up)"),
            *self.limit_rules(cfg),
            # transformers' generic yarn scales cos/sin alone; archlab's mscale_all_dim also scales the softmax
            ("model.position.scaling.mscale", (None,), " (its YaRN never scales the softmax, as mscale_all_dim does)"),
            ("model.position.scaling.mscale_all_dim", (None,), " (its YaRN never scales the softmax)"),
        ]

    @staticmethod
    def limit_rules(cfg: ModelConfig) -> list[Rule]:
        if getattr(cfg.mlp, "swiglu_limit", None) is None:  # a GELU MLP has no clamp to set
            return [("model.mlp.swiglu_limit", ("a number",), " (its SwiGLU always clamps)")]
        return []

    def layout_problems(self, cfg: ModelConfig, layers: list[ModelConfig]) -> list[Problem]:
        return one_window(layers)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        layers, m = layer_configs(cfg), cfg.mlp
        return dict(
            self.base_to_hf(cfg),
            intermediate_size=expert_width(cfg),
            hidden_act="silu",  # unread: the experts compute their own clamped SwiGLU
            swiglu_limit=m.swiglu_limit,
            swiglu_alpha=m.swiglu_alpha,
            rope_parameters=rope_to_hf(cfg),
            **sliding_to_hf(cfg, layers),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        hd = config_head_dim(c)
        rope = dict(c.rope_parameters or {})
        for key in ("mscale", "mscale_all_dim"):
            if rope.get(key):
                refuse_hf(
                    c,
                    f"rope_parameters.{key}",
                    "absent (transformers' gpt-oss YaRN scales cos and sin alone; archlab's mscales also scale the "
                    "softmax, DeepSeek's reading)",
                    rope[key],
                )
        position = rope_from_hf(c, hd, partial=False, scalings=("default", "yarn"))
        mlp = mlp_section(
            "moe",
            expert="swiglu",
            bias=True,
            expert_d_ff=c.intermediate_size,
            swiglu_limit=float(c.swiglu_limit),
            swiglu_alpha=float(c.swiglu_alpha),
            up_offset=1.0,
            routing=dict(
                n_experts=c.num_local_experts,
                top_k=c.num_experts_per_tok,
                normalize_top_k=True,
                router_bias=True,
                aux_loss_weight=float(c.router_aux_loss_coef),
            ),
        )
        cfg = self.base_from_hf(c, position, mlp)
        cfg.attention.sinks = True
        types = checked_types(c)
        names = ["sliding" if t == "sliding_attention" else "full" for t in types]
        overrides = {"sliding": {"attention": {"window": c.sliding_window}}, "full": {}}
        return apply_layout(cfg, names, overrides)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm")
            t.add(f"{b}.mlp_norm", f"{h}.post_attention_layernorm")
            t.maps.append(TensorMap(f"{b}.attn.sinks", (f"{h}.self_attn.sinks",)))
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", cfg.attention.qkv_bias)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj", cfg.attention.out_bias)
            t.add(f"{b}.mlp.router", f"{h}.mlp.router", True)
            x, e = f"{b}.mlp.experts", f"{h}.mlp.experts"
            t.maps += [
                TensorMap(f"{x}.gate_up", (f"{e}.gate_up_proj",), "gate_up_interleaved"),
                TensorMap(f"{x}.gate_up_bias", (f"{e}.gate_up_proj_bias",), "gate_up_interleaved"),
                TensorMap(f"{x}.down", (f"{e}.down_proj",), "experts_transposed"),
                TensorMap(f"{x}.down_bias", (f"{e}.down_proj_bias",)),
            ]
        t.add("final_norm", "model.norm")
        return t.head()


RECORDS: tuple[Family, ...] = (GptOss(),)
