"""OPT (``OPTForCausalLM``): pre-norm or post-norm LayerNorm blocks, learned positions stored with OPT's
offset of two rows, separate q/k/v Linears, a plain MLP, one ``enable_bias`` flag for every Linear."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    POSITION_OPTIONS,
    BlockConfig,
    ModelConfig,
    NormConfig,
)
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Rule, fmt, no_embedding_dropout, out_bias
from archlab.interop.families.mlps import plain_activation, plain_mlp
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import dropouts, refuse_hf
from archlab.nn.head import embedding_width
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mlp import d_ff

OFFSET = 2  # OPT's learned position table starts with two rows no token reads: position p is row p + 2
EPS = 1e-5  # OPT's LayerNorms are torch's default: its config has no key for their eps


class Opt(Family):
    """OPTForCausalLM: pre-norm (``do_layer_norm_before``, a final norm) or post-norm (no final norm, as
    opt-350m); token embeddings of ``word_embed_proj_dim`` projected in and out of hidden_size where it
    differs (opt-350m: ``model.embedding_dim``); learned positions, HF's table holding two leading rows
    archlab's lacks; LayerNorms of eps 1e-5, with a scale and shift or none (``layer_norm_elementwise_affine``:
    ``model.norm.affine``); q/k/v, output and MLP Linears with biases or none (one
    ``enable_bias``); a ReLU (or GELU) MLP of ``ffn_dim``; no head bias. ``dropout`` drops each sublayer's
    output (after ``out_proj`` and ``fc2``), not the embeddings: ``model.dropout`` with
    ``model.embedding_dropout`` 0.0; ``attention_dropout`` drops the attention probabilities."""

    model_type, title, model_class, config_class = "opt", "OPT", "OPTForCausalLM", "OPTConfig"
    keys = {
        "vocab_size": "vocab_size",
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "attention.n_head",
        "max_position_embeddings": "context_length",
        "init_std": "init_std",
        "tie_word_embeddings": "head.tied",
    }
    prefix = "model."
    features = frozenset({"model.dropout", "model.embedding_dropout", "model.embedding_dim", "model.norm.affine"})
    position_kind = "learned"
    position_why = " (OPT's table)"
    parts = "pre- or post-norm LayerNorm, learned positions (offset 2), embedding projections, ReLU MLP, one bias flag"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        a = cfg.attention
        one_bias = " (one enable_bias flag sets q/k/v, output and MLP)"
        return [
            ("model.norm.kind", ("layernorm",), ""),
            *([("model.norm.bias", (True,), "")] if cfg.norm.affine else []),  # no shift to have without a scale
            ("model.norm.eps", (EPS,), " (OPT's LayerNorms use torch's default; its config has no eps)"),
            ("model.block.kind", ("pre", "post"), " (do_layer_norm_before true or false)"),
            ("model.mlp.kind", ("gelu", "relu"), ""),
            *self.mha_rules(cfg),
            out_bias(a.qkv_bias, one_bias),
            ("model.mlp.bias", (a.qkv_bias,), one_bias),
            NO_HEAD_BIAS,
            no_embedding_dropout(cfg, self.title),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            self.keys_to_hf(cfg),
            ffn_dim=d_ff(cfg),
            do_layer_norm_before=cfg.block.kind == "pre",
            word_embed_proj_dim=embedding_width(cfg),
            dropout=cfg.dropout,
            attention_dropout=cfg.attention.dropout,
            activation_function=plain_activation(cfg),
            layerdrop=0.0,
            enable_bias=cfg.attention.qkv_bias,
            layer_norm_elementwise_affine=cfg.norm.affine,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.layerdrop != 0.0:
            refuse_hf(c, "layerdrop", f"{fmt(0.0)} (archlab runs every layer)")
        if c.do_layer_norm_before and getattr(c, "_remove_final_layer_norm", False):
            refuse_hf(c, "_remove_final_layer_norm", "false (a pre-norm archlab model ends with a final norm)")
        bias = bool(c.enable_bias)
        mlp = plain_mlp(c, "activation_function", c.ffn_dim)
        mlp.bias = bias
        cfg = ModelConfig(
            **dropouts(c.dropout, 0.0),
            embedding_dim=None if c.word_embed_proj_dim == c.hidden_size else c.word_embed_proj_dim,
            norm=NormConfig(kind="layernorm", eps=EPS, bias=True, affine=bool(c.layer_norm_elementwise_affine)),
            block=BlockConfig(kind="pre" if c.do_layer_norm_before else "post"),
            position=POSITION_OPTIONS.make(kind="learned"),
            attention=AttentionConfig(qkv_bias=bias, out_bias=bias, dropout=float(c.attention_dropout)),
            mlp=mlp,
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, bias, d = Tensors(cfg), cfg.attention.qkv_bias, "model.decoder"

        def norm(archlab: str, hf: str) -> None:  # layer_norm_elementwise_affine false: the norms hold nothing
            if cfg.norm.affine:
                t.add(archlab, hf, True)

        t.add("tok_emb", f"{d}.embed_tokens")
        t.add("position.table", f"{d}.embed_positions", layout="offset_rows", sizes=(OFFSET,))
        if cfg.embedding_dim is not None:  # word_embed_proj_dim other than hidden_size (opt-350m)
            t.add("project_in", f"{d}.project_in")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"{d}.layers.{i}"
            norm(f"{b}.attn_norm", f"{h}.self_attn_layer_norm")
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", bias)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.out_proj", bias)
            norm(f"{b}.mlp_norm", f"{h}.final_layer_norm")
            t.add(f"{b}.mlp.fc", f"{h}.fc1", bias)
            t.add(f"{b}.mlp.proj", f"{h}.fc2", bias)
        if cfg.block.kind == "pre":  # post-norm blocks end normed: no final norm (BLOCKS' final_norm)
            norm("final_norm", f"{d}.final_layer_norm")
        if cfg.embedding_dim is not None:
            t.add("project_out", f"{d}.project_out")
        return t.head()


RECORDS: tuple[Family, ...] = (Opt(),)
