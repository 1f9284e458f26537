"""Cohere2 (``Cohere2ForCausalLM``): Cohere's parallel blocks, sliding and global layers, the logit scale folded
into the final norm (the layered machinery in ``layered``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from torch import Tensor

from archlab.config import (
    BlockConfig,
    ModelConfig,
    NormConfig,
    n_kv_head,
)
from archlab.interop.families.base import LAYERS, NO_HEAD_BIAS, Family, Problem, Rule, out_bias
from archlab.interop.families.layered import Layer, LayeredFamily, rope_of, rule_problems
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import GATED_TO_HF, activation, gated_activation, mlp_section
from archlab.interop.families.rope import rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.interop.families.windows import SLIDING, checked_types, sliding_to_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mlp import d_ff


class Cohere2(LayeredFamily):
    """Cohere2ForCausalLM (Command R7B, Command A): a parallel block with one LayerNorm without bias feeding
    attention and MLP, interleaved RoPE on the sliding layers and none on the full ones, q/k/v and output
    biases together (``attention_bias``), a gated MLP without biases, head_dim = hidden_size / heads, and
    the logits times ``logit_scale``. archlab has no logit scale: it is folded into the final LayerNorm's
    scale (the norm has no bias, so norm(h)·w·s = norm(h)·(w·s), and the head is linear), which is exact in
    any float format when the scale is a power of two (the published 0.25 and 0.0625); other scales are
    refused. An archlab model exports with logit_scale 1."""

    parts = "parallel block, bias-free LayerNorm, interleaved RoPE on local layers, global NoPE, logit scale"

    model_type, title, model_class, config_class = "cohere2", "Cohere2", "Cohere2ForCausalLM", "Cohere2Config"
    prefix = "model."
    keys = {**LLAMA_KEYS, "layer_norm_eps": "norm.eps"}
    features = frozenset({"model.position.scaling.kind", "model.attention.window", *LAYERS})
    nope = True
    layout_why = " (Cohere2's sliding layers have RoPE and its full layers none)"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        H, d = cfg.attention.n_head, cfg.d_model
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (False,), " (Cohere2's LayerNorm has no bias)"),
            ("model.block.kind", ("parallel",), ""),
            ("model.block.shared_norm", (True,), " (one input_layernorm feeds attention and MLP)"),
            ("model.position.pairing", ("interleaved",), ""),
            ("model.attention.head_dim", (None, d // H), " (Cohere2 sets head_dim = hidden_size / heads)"),
            out_bias(cfg.attention.qkv_bias, " (one attention_bias flag sets both)"),
            ("model.mlp.kind", ("swiglu", "geglu"), ""),
            ("model.mlp.bias", (False,), ""),
            NO_HEAD_BIAS,
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        found = super().part_problems(cfg)
        return found or self.full_rotary(cfg)

    def layer_problems(self, lcs: list[ModelConfig]) -> list[tuple[int, Problem]]:
        return rule_problems(lcs, lambda i, lc: "none" if lc.attention.window is None else "rope", self.layout_why)

    def uniform_to_hf(self, rep: ModelConfig) -> dict[str, Any]:
        a = rep.attention
        return dict(
            self.keys_to_hf(rep),
            intermediate_size=d_ff(rep),
            num_key_value_heads=n_kv_head(rep),
            hidden_act=GATED_TO_HF[activation(rep.mlp)],
            rope_parameters=rope_to_hf(rep),
            attention_bias=a.qkv_bias,
            attention_dropout=a.dropout,
            logit_scale=1.0,
        )

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        return sliding_to_hf(cfg, lcs)

    def hf_layers(self, c: Any) -> list[Layer]:
        types = checked_types(c)
        rope = dataclasses.replace(
            rope_of(c, c.rope_parameters, c.hidden_size // c.num_attention_heads), pairing="interleaved"
        )
        nope = dataclasses.replace(rope, kind="none")
        return [Layer(c.sliding_window, rope) if t == SLIDING else Layer(None, nope) for t in types]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        scale = c.logit_scale
        if not (scale > 0 and math.frexp(scale)[0] == 0.5):
            refuse_hf(c, "logit_scale", "a power of two (folded exactly into the final norm's scale)")
        kind, approximate = gated_activation(c)
        bias = bool(c.attention_bias)
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="layernorm", bias=False),
            block=BlockConfig(kind="parallel", shared_norm=True),
            attention=AttentionConfig(
                n_kv_head=c.num_key_value_heads,
                qkv_bias=bias,
                out_bias=bias,
                dropout=float(c.attention_dropout),
            ),
            mlp=mlp_section(kind, d_ff=c.intermediate_size, bias=False, approximate=approximate),
        )
        return self.keys_from_hf(c, cfg)

    def hf_weights(self, c: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
        if c.logit_scale == 1.0:
            return state
        return {**state, "model.norm.weight": state["model.norm.weight"] * c.logit_scale}

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, bias = Tensors(cfg), cfg.attention.qkv_bias
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm")
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", bias)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj", bias)
            t.gate_up(f"{b}.mlp.gate_up", f"{h}.mlp", False)
            t.add(f"{b}.mlp.down", f"{h}.mlp.down_proj")
        t.add("final_norm", "model.norm")
        return t.head()


RECORDS: tuple[Family, ...] = (Cohere2(),)
