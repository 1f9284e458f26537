"""StableLM (``StableLmForCausalLM``): LayerNorm, a gated MLP, partial RoPE; StableLM 2's per-head QK
LayerNorms without a shift and its parallel block."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    BlockConfig,
    ModelConfig,
    NormConfig,
    n_kv_head,
)
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Rule, out_bias
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import GATED_TO_HF, activation, gated_mlp
from archlab.interop.families.rope import rope_fraction, rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff


class StableLM(Family):
    """StableLmForCausalLM. StableLM-3B-4E1T and StableLM-2-1.6B: pre-norm LayerNorms with a shift, a
    gated MLP without biases, partial half-paired RoPE, q/k/v biases (``use_qkv_bias``), no output or
    head bias. StableLM-2-12B: one shared LayerNorm before attention and MLP in parallel
    (``use_parallel_residual``) and a LayerNorm of q and k per head with a scale per head and no shift
    (``qk_layernorm``: ``qk_norm=head``, ``qk_norm_per_head_scale``, ``qk_norm_bias=false``). Only the
    attention probabilities drop out (``hidden_dropout`` drops the MLP's output alone: refused)."""

    model_type, title, model_class, config_class = "stablelm", "StableLM", "StableLmForCausalLM", "StableLmConfig"
    keys = {**LLAMA_KEYS, "layer_norm_eps": "norm.eps"}
    prefix = "model."
    features = frozenset(
        {"model.attention.qk_norm", "model.attention.qk_norm_per_head_scale", "model.attention.qk_norm_bias"}
    )
    parts = (
        "layernorm, pre or parallel (one norm) block, gated MLP, GQA, q/k/v bias, partial rope, "
        "per-head QK layernorm without shift"
    )

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        a = cfg.attention
        qk = a.qk_norm == "head"
        why = " (qk_layernorm: a LayerNorm per head without a shift)"
        rules: list[Rule] = [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.block.kind", ("pre", "parallel"), ""),
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.kind", ("swiglu", "geglu"), ""),
            ("model.mlp.bias", (False,), ""),
            ("model.attention.head_dim", (None, cfg.d_model // a.n_head), " (StableLM uses d_model / n_head)"),
            out_bias(False, " (o_proj has no bias)"),
            ("model.attention.qk_norm", ("none", "head"), why),
            ("model.attention.qk_norm_per_head_scale", (qk,), why),
            ("model.attention.qk_norm_bias", (False,) if qk else (None,), why),
            NO_HEAD_BIAS,
        ]
        if cfg.block.kind == "parallel":
            rules.append(("model.block.shared_norm", (True,), " (one input_layernorm feeds attention and MLP)"))
        return rules

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        a = cfg.attention
        return dict(
            self.keys_to_hf(cfg),
            intermediate_size=d_ff(cfg),
            num_key_value_heads=n_kv_head(cfg),
            hidden_act=GATED_TO_HF[activation(cfg.mlp)],
            rope_parameters=rope_to_hf(cfg, rope_fraction(cfg)),
            use_qkv_bias=a.qkv_bias,
            qk_layernorm=a.qk_norm == "head",
            use_parallel_residual=cfg.block.kind == "parallel",
            hidden_dropout=0.0,
            attention_dropout=a.dropout,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.hidden_dropout:
            refuse_hf(c, "hidden_dropout", "0.0 (StableLM drops the MLP's output alone; archlab's model.dropout all)")
        hd = c.hidden_size // c.num_attention_heads
        qk = bool(c.qk_layernorm)
        cfg = ModelConfig(
            norm=NormConfig(kind="layernorm", bias=True),
            block=BlockConfig(kind="parallel", shared_norm=True) if c.use_parallel_residual else BlockConfig(),
            position=rope_from_hf(c, hd, partial=True, scalings=("default",)),
            attention=AttentionConfig(
                n_kv_head=c.num_key_value_heads,
                qkv_bias=bool(c.use_qkv_bias),
                out_bias=False,
                dropout=float(c.attention_dropout),
                qk_norm="head" if qk else "none",
                qk_norm_per_head_scale=qk,
                qk_norm_bias=False if qk else None,
            ),
            mlp=gated_mlp(c, "hidden_act"),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, a, hd = Tensors(cfg), cfg.attention, head_dim(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm", True)
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", a.qkv_bias)
            if a.qk_norm == "head":  # one LayerNorm of hd per head: archlab's flat scale is their rows
                for name, heads in (("q", a.n_head), ("k", n_kv_head(cfg))):
                    norms = [f"{h}.self_attn.{name}_layernorm.norms.{j}" for j in range(heads)]
                    t.stacked(f"{b}.attn.{name}_norm", norms, False, (hd,) * heads)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj")
            if cfg.block.kind == "pre":
                t.add(f"{b}.mlp_norm", f"{h}.post_attention_layernorm", True)
            t.gate_up(f"{b}.mlp.gate_up", f"{h}.mlp", False)
            t.add(f"{b}.mlp.down", f"{h}.mlp.down_proj")
        t.add("final_norm", "model.norm", True)
        return t.head()


RECORDS: tuple[Family, ...] = (StableLM(),)
