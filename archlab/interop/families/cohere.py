"""Cohere (CohereForCausalLM: Command R, Command R+, Aya 23): a parallel block fed by one LayerNorm
without bias, interleaved RoPE, optional per-head QK-norm, and the logits times ``logit_scale``."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    BlockConfig,
    HeadConfig,
    ModelConfig,
    NormConfig,
    n_kv_head,
)
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule, out_bias
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import GATED_TO_HF, activation, gated_mlp
from archlab.interop.families.phi3 import fixed_head_dim, head_dim_rule
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff


class Cohere(Family):
    """CohereForCausalLM: one LayerNorm without bias feeds attention and a gated MLP in parallel,
    interleaved full RoPE, q/k/v and output biases together (``attention_bias``), ``use_qk_norm``: a
    LayerNorm of each q and k head with a scale per head (``q_norm.weight`` [H, hd], archlab's flat
    H·hd), and ``logit_scale`` (``model.head.logit_scale``, both multiply the logits)."""

    model_type, title, model_class, config_class = "cohere", "Cohere", "CohereForCausalLM", "CohereConfig"
    prefix = "model."
    keys = {**LLAMA_KEYS, "layer_norm_eps": "norm.eps"}
    features = frozenset(
        {
            "model.position.scaling.kind",
            "model.head.logit_scale",
            "model.attention.qk_norm",
            "model.attention.qk_norm_per_head_scale",
        }
    )
    parts = "parallel block, one LayerNorm without bias, interleaved RoPE, gated MLP, per-head QK-norm, logit scale"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        head = cfg.attention.qk_norm == "head"
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (False,), " (Cohere's LayerNorm has no bias)"),
            ("model.block.kind", ("parallel",), ""),
            ("model.block.shared_norm", (True,), " (one input_layernorm feeds attention and MLP)"),
            ("model.position.pairing", ("interleaved",), ""),
            head_dim_rule(cfg, self.title),
            out_bias(cfg.attention.qkv_bias, " (one attention_bias flag sets both)"),
            ("model.attention.qk_norm", ("none", "head"), " (use_qk_norm norms each head)"),
            ("model.attention.qk_norm_per_head_scale", (head,), " (use_qk_norm's scale is [heads, head_dim])"),
            ("model.mlp.kind", ("swiglu", "geglu"), ""),
            ("model.mlp.bias", (False,), ""),
            NO_HEAD_BIAS,
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return super().part_problems(cfg) + self.full_rotary(cfg)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        a = cfg.attention
        return dict(
            self.keys_to_hf(cfg),
            intermediate_size=d_ff(cfg),
            num_key_value_heads=n_kv_head(cfg),
            hidden_act=GATED_TO_HF[activation(cfg.mlp)],
            rope_parameters=rope_to_hf(cfg),
            attention_bias=a.qkv_bias,
            attention_dropout=a.dropout,
            use_qk_norm=a.qk_norm == "head",
            logit_scale=cfg.head.logit_scale,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        scale = c.logit_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            refuse_hf(c, "logit_scale", "a positive number (the logits are multiplied by it)")
        hd, bias = fixed_head_dim(c), bool(c.attention_bias)
        position = rope_from_hf(c, hd, partial=False)
        position.pairing = "interleaved"
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="layernorm", bias=False),
            block=BlockConfig(kind="parallel", shared_norm=True),
            position=position,
            attention=AttentionConfig(
                n_kv_head=c.num_key_value_heads,
                qkv_bias=bias,
                out_bias=bias,
                dropout=float(c.attention_dropout),
                qk_norm="head" if c.use_qk_norm else "none",
                qk_norm_per_head_scale=bool(c.use_qk_norm),
            ),
            mlp=gated_mlp(c, "hidden_act"),
            head=HeadConfig(bias=False, logit_scale=float(scale)),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, a = Tensors(cfg), cfg.attention
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm")
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", a.qkv_bias)
            if a.qk_norm == "head":  # [heads, head_dim] in transformers, flat in archlab
                t.add(f"{b}.attn.q_norm", f"{h}.self_attn.q_norm", layout="flat", sizes=(a.n_head, head_dim(cfg)))
                t.add(f"{b}.attn.k_norm", f"{h}.self_attn.k_norm", layout="flat", sizes=(n_kv_head(cfg), head_dim(cfg)))
            t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj", a.out_bias)
            t.gate_up(f"{b}.mlp.gate_up", f"{h}.mlp", False)
            t.add(f"{b}.mlp.down", f"{h}.mlp.down_proj")
        t.add("final_norm", "model.norm")
        return t.head()


RECORDS: tuple[Family, ...] = (Cohere(),)
