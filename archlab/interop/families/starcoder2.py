"""StarCoder 2 (``Starcoder2ForCausalLM``): pre-norm LayerNorm, a plain MLP (``c_fc``, ``c_proj``), GQA,
a sliding window on every layer, one ``use_bias`` flag."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    BlockConfig,
    ModelConfig,
    NormConfig,
    embedding_dropout,
    n_kv_head,
)
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule, out_bias
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import PLAIN_TO_HF, activation, plain_mlp
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import dropouts
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mlp import d_ff


class StarCoder2(Family):
    """Starcoder2ForCausalLM: pre-norm with LayerNorms that have a shift, separate q/k/v and output
    Linears, GQA, full half-paired RoPE, a plain MLP (``c_fc``, ``c_proj``), one ``use_bias`` flag for
    every Linear, ``sliding_window`` on every layer or none, ``residual_dropout`` on each sublayer's output
    (``model.dropout``) and ``embedding_dropout`` on the embeddings (``model.embedding_dropout``, null where
    the two are equal), no head bias."""

    model_type, title, model_class, config_class = (
        "starcoder2",
        "StarCoder 2",
        "Starcoder2ForCausalLM",
        "Starcoder2Config",
    )
    keys = {**LLAMA_KEYS, "norm_epsilon": "norm.eps"}
    prefix = "model."
    features = frozenset(
        {"model.dropout", "model.embedding_dropout", "model.position.scaling.kind", "model.attention.window"}
    )
    parts = "layernorm, pre block, plain MLP, GQA, one bias flag, full rope, sliding window"
    # the tanh GELU as StarCoder 2's checkpoints name it
    activations = {**PLAIN_TO_HF, ("gelu", "tanh"): "gelu_pytorch_tanh"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        a = cfg.attention
        one_bias = " (one use_bias flag sets q/k/v, output and MLP)"
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.block.kind", ("pre",), ""),
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.kind", ("gelu", "relu"), ""),
            ("model.attention.head_dim", (None, cfg.d_model // a.n_head), " (StarCoder 2 uses d_model / n_head)"),
            out_bias(a.qkv_bias, one_bias),
            ("model.mlp.bias", (a.qkv_bias,), one_bias),
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
            hidden_act=self.activations[activation(cfg.mlp)],
            rope_parameters=rope_to_hf(cfg),
            sliding_window=a.window,
            attention_dropout=a.dropout,
            residual_dropout=cfg.dropout,
            embedding_dropout=embedding_dropout(cfg),
            use_bias=a.qkv_bias,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        hd = c.hidden_size // c.num_attention_heads
        mlp = plain_mlp(c, "hidden_act", c.intermediate_size)
        mlp.bias = bool(c.use_bias)
        cfg = ModelConfig(
            **dropouts(c.residual_dropout, c.embedding_dropout),
            norm=NormConfig(kind="layernorm", bias=True),
            block=BlockConfig(kind="pre"),
            position=rope_from_hf(c, hd, partial=False),
            attention=AttentionConfig(
                n_kv_head=c.num_key_value_heads,
                qkv_bias=bool(c.use_bias),
                out_bias=bool(c.use_bias),
                dropout=float(c.attention_dropout),
                window=c.sliding_window,
            ),
            mlp=mlp,
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, bias = Tensors(cfg), cfg.attention.qkv_bias
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm", True)
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", bias)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj", bias)
            t.add(f"{b}.mlp_norm", f"{h}.post_attention_layernorm", True)
            t.add(f"{b}.mlp.fc", f"{h}.mlp.c_fc", bias)
            t.add(f"{b}.mlp.proj", f"{h}.mlp.c_proj", bias)
        t.add("final_norm", "model.norm", True)
        return t.head()


RECORDS: tuple[Family, ...] = (StarCoder2(),)
