"""GPT-NeoX (Pythia) and Phi: LayerNorm, a plain MLP, partial half-paired RoPE."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    BlockConfig,
    HeadConfig,
    ModelConfig,
    NormConfig,
    embedding_dropout,
    n_kv_head,
)
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Rule, out_bias
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import plain_activation, plain_mlp
from archlab.interop.families.rope import rope_fraction, rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, dropouts
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff

# ---- GPT-NeoX and Phi: LayerNorm, plain MLP, partial half-paired RoPE


class GPTNeoX(Family):
    """GPTNeoXForCausalLM (Pythia): two LayerNorms per block, in parallel (``use_parallel_residual``)
    or in series (pre-norm); one fused q/k/v Linear laid out per head; partial half-paired RoPE; one
    ``attention_bias`` for q/k/v and output; MLP biases; no head bias."""

    parts = "parallel (two LayerNorms) or pre-norm, per-head fused q/k/v, partial RoPE (scaled), plain MLP"

    model_type, title, model_class, config_class = "gpt_neox", "GPT-NeoX", "GPTNeoXForCausalLM", "GPTNeoXConfig"
    prefix = "gpt_neox."
    keys = {**LLAMA_KEYS, "layer_norm_eps": "norm.eps"}
    features = frozenset({"model.dropout", "model.position.scaling.kind"})
    renames = {"embed_out.": "lm_head."}  # checkpoints written before transformers 5

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        rules = [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.block.kind", ("parallel", "pre"), ""),
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.kind", ("gelu", "relu"), ""),
            ("model.mlp.bias", (True,), ""),
            *self.mha_rules(cfg),
            out_bias(cfg.attention.qkv_bias, " (one attention_bias flag sets both)"),
            NO_HEAD_BIAS,
        ]
        if cfg.block.kind == "parallel":
            rules.append(("model.block.shared_norm", (False,), " (two LayerNorms per block)"))
        return rules

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            self.keys_to_hf(cfg),
            intermediate_size=d_ff(cfg),
            hidden_act=plain_activation(cfg),
            attention_dropout=cfg.attention.dropout,
            hidden_dropout=cfg.dropout,
            use_parallel_residual=cfg.block.kind == "parallel",
            rope_parameters=rope_to_hf(cfg, rope_fraction(cfg)),
            attention_bias=cfg.attention.qkv_bias,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        hd = c.hidden_size // c.num_attention_heads
        cfg = ModelConfig(
            dropout=float(c.hidden_dropout),
            norm=NormConfig(kind="layernorm", bias=True),
            block=BlockConfig(kind="parallel", shared_norm=False) if c.use_parallel_residual else BlockConfig(),
            position=rope_from_hf(c, hd, partial=True),
            attention=AttentionConfig(
                qkv_bias=c.attention_bias,
                out_bias=c.attention_bias,
                dropout=float(c.attention_dropout),
            ),
            mlp=plain_mlp(c, "hidden_act", c.intermediate_size),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, bias = Tensors(cfg), cfg.attention.qkv_bias
        t.add("tok_emb", "gpt_neox.embed_in")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"gpt_neox.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm", True)
            t.add(f"{b}.mlp_norm", f"{h}.post_attention_layernorm", True)
            t.add(
                f"{b}.attn.qkv",
                f"{h}.attention.query_key_value",
                bias,
                "heads_interleaved",
                (cfg.attention.n_head, head_dim(cfg)),
            )
            t.add(f"{b}.attn.proj", f"{h}.attention.dense", bias)
            t.add(f"{b}.mlp.fc", f"{h}.mlp.dense_h_to_4h", True)
            t.add(f"{b}.mlp.proj", f"{h}.mlp.dense_4h_to_h", True)
        t.add("final_norm", "gpt_neox.final_layer_norm", True)
        return t.head()


class Phi(Family):
    """PhiForCausalLM (phi-1.5, phi-2): parallel block with one shared LayerNorm, separate q/k/v and
    output Linears with biases, optional per-head LayerNorm of q and k, partial half-paired RoPE,
    MLP biases and a head bias."""

    parts = "parallel block, one shared LayerNorm, partial RoPE, GQA, per-head QK LayerNorm, head bias"

    model_type, title, model_class, config_class = "phi", "Phi", "PhiForCausalLM", "PhiConfig"
    prefix = "model."
    keys = {**LLAMA_KEYS, "layer_norm_eps": "norm.eps"}
    features = frozenset(
        {"model.dropout", "model.embedding_dropout", "model.position.scaling.kind", "model.attention.qk_norm"}
    )

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        rules = [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.block.kind", ("parallel",), ""),
            ("model.block.shared_norm", (True,), " (one input_layernorm feeds attention and MLP)"),
            ("model.position.pairing", ("half",), ""),
            ("model.attention.qkv_bias", (True,), ""),
            out_bias(True),
            ("model.attention.qk_norm", ("none", "head"), " (qk_layernorm is per head)"),
            ("model.mlp.kind", ("gelu", "relu"), ""),
            ("model.mlp.bias", (True,), ""),
            ("model.head.bias", (True,), ""),
        ]
        if cfg.attention.qk_norm == "head":
            H, d = cfg.attention.n_head, cfg.d_model
            rules.append(("model.attention.head_dim", (None, d // H), " (qk_layernorm spans d_model / n_head)"))
        return rules

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            self.keys_to_hf(cfg),
            intermediate_size=d_ff(cfg),
            num_key_value_heads=n_kv_head(cfg),
            head_dim=head_dim(cfg),
            resid_pdrop=cfg.dropout,
            embd_pdrop=embedding_dropout(cfg),
            attention_dropout=cfg.attention.dropout,
            hidden_act=plain_activation(cfg),
            rope_parameters=rope_to_hf(cfg, rope_fraction(cfg)),
            qk_layernorm=cfg.attention.qk_norm == "head",
        )

    def from_hf(self, c: Any) -> ModelConfig:
        hd = config_head_dim(c)
        cfg = ModelConfig(
            **dropouts(c.resid_pdrop, c.embd_pdrop),
            norm=NormConfig(kind="layernorm", bias=True),
            block=BlockConfig(kind="parallel", shared_norm=True),
            position=rope_from_hf(c, hd, partial=True),
            attention=AttentionConfig(
                n_kv_head=c.num_key_value_heads,
                head_dim=hd,
                qkv_bias=True,
                out_bias=True,
                dropout=float(c.attention_dropout),
                qk_norm="head" if c.qk_layernorm else "none",
            ),
            mlp=plain_mlp(c, "hidden_act", c.intermediate_size),
            head=HeadConfig(bias=True),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm", True)
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", True)
            if cfg.attention.qk_norm == "head":
                t.add(f"{b}.attn.q_norm", f"{h}.self_attn.q_layernorm", True)
                t.add(f"{b}.attn.k_norm", f"{h}.self_attn.k_layernorm", True)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.dense", True)
            t.add(f"{b}.mlp.fc", f"{h}.mlp.fc1", True)
            t.add(f"{b}.mlp.proj", f"{h}.mlp.fc2", True)
        t.add("final_norm", "model.final_layernorm", True)
        return t.head()


RECORDS: tuple[Family, ...] = (GPTNeoX(), Phi())
