"""MPT (``MptForCausalLM``: MPT-7B, MPT-30B): pre-norm LayerNorms without a shift, ALiBi, one fused bias-free
``Wqkv`` clamped as projected (``clip_qkv``), an exact-GELU MLP of 4·d_model, no biases anywhere."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    POSITION_OPTIONS,
    BlockConfig,
    ModelConfig,
    NormConfig,
)
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule, fmt, no_embedding_dropout, out_bias
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import dropouts, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mlp import d_ff

# attn_config keys transformers' MPT does not read, with the only value its computation matches
_FIXED = {
    "attn_type": ("multihead_attention", "Wqkv holds a key and a value per query head"),
    "prefix_lm": (False, "archlab attention is causal"),
    "qk_ln": (False, "transformers' MPT norms no q or k"),
    "alibi": (True, "transformers' MPT always adds ALiBi and has no position table"),
    "alibi_bias_max": (8, "transformers' MPT builds its ALiBi slopes with 8, Press et al.'s"),
}


_INT_DROPOUT = " (transformers' MptAttentionConfig types attn_pdrop an int: 0 alone converts)"

# MPT's config keys, shared with DBRX and copied as they are (``Family.keys``).
MPT_KEYS = {
    "vocab_size": "vocab_size",
    "d_model": "d_model",
    "n_heads": "attention.n_head",
    "n_layers": "n_layer",
    "max_seq_len": "context_length",
    "initializer_range": "init_std",
}


class Mpt(Family):
    """MptForCausalLM: pre-norm LayerNorms with a scale and no shift (``model.norm.bias`` false), ALiBi with
    Press et al.'s slopes, a fused ``Wqkv`` ([Q | K | V], as archlab's) whose output is clamped to
    [-clip_qkv, clip_qkv], scores scaled by ``softmax_scale`` (null: 1/sqrt(head_dim)), an exact-GELU MLP of
    4·d_model, no Linear biases, no head bias. ``attn_pdrop`` drops the attention probabilities and each
    sublayer's output, nothing the embeddings (``model.dropout`` and ``model.attention.dropout`` equal,
    ``model.embedding_dropout`` 0.0); its config class types ``attn_pdrop`` an int, so an archlab layout
    with dropout does not convert. transformers' MPT does not read ``resid_pdrop``, ``emb_pdrop``,
    ``learned_pos_emb``, ``embedding_fraction`` (a gradient scale), ``norm_type`` or ``attn_impl``: accepted,
    not read; the config keys that would change the model it computes are refused unless at the value it
    assumes (``no_bias``, ``expansion_ratio``, ``logit_scale`` and ``attn_config``'s ``_FIXED``)."""

    model_type, title, model_class, config_class = "mpt", "MPT", "MptForCausalLM", "MptConfig"
    keys = {**MPT_KEYS, "layer_norm_epsilon": "norm.eps", "tie_word_embeddings": "head.tied"}
    prefix = "transformer."
    features = frozenset(
        {"model.dropout", "model.embedding_dropout", "model.attention.clip_qkv", "model.attention.scale"}
    )
    position_kind = "alibi"
    parts = "pre-norm LayerNorm without bias, ALiBi, fused q/k/v with clip_qkv, GELU MLP of 4·d_model, no biases"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (False,), " (MPT's LayerNorms have no bias)"),
            ("model.block.kind", ("pre",), ""),
            ("model.mlp.kind", ("gelu",), ""),
            ("model.mlp.approximate", ("none",), " (MPT's GELU is exact)"),
            ("model.mlp.bias", (False,), ""),
            ("model.attention.qkv_bias", (False,), ""),
            out_bias(False),
            *self.mha_rules(cfg),
            ("model.dropout", (0.0,), _INT_DROPOUT),
            ("model.attention.dropout", (0.0,), _INT_DROPOUT),
            NO_HEAD_BIAS,
            no_embedding_dropout(cfg, self.title),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        found = super().part_problems(cfg)
        if cfg.mlp.kind != "none" and d_ff(cfg) != 4 * cfg.d_model:  # none: refused for its kind
            found.append(Problem("model.mlp.d_ff", d_ff(cfg), f"{4 * cfg.d_model}", " (MPT's MLP is 4·d_model wide)"))
        if cfg.attention.clip_qkv == 0:
            found.append(Problem("model.attention.clip_qkv", 0.0, "null or > 0", " (MPT reads clip_qkv 0 as none)"))
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        a = cfg.attention
        return dict(
            self.keys_to_hf(cfg),
            attn_config=dict(
                attn_pdrop=0,
                clip_qkv=a.clip_qkv,
                softmax_scale=a.scale,
            ),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        a = c.attn_config
        for name, (want, why) in _FIXED.items():
            if getattr(a, name) != want:
                refuse_hf(c, f"attn_config.{name}", f"{fmt(want)} ({why})", getattr(a, name))
        if c.no_bias is not True:
            refuse_hf(c, "no_bias", "true (transformers' MPT has no biases)")
        if c.expansion_ratio != 4:
            refuse_hf(c, "expansion_ratio", "4 (transformers' MPT MLP is 4·d_model wide)")
        if c.logit_scale is not None:
            refuse_hf(c, "logit_scale", "null (transformers' MPT does not scale its logits)")
        clip = float(a.clip_qkv) if a.clip_qkv else None  # 0 clamps nothing
        cfg = ModelConfig(
            **dropouts(a.attn_pdrop, 0.0),
            norm=NormConfig(kind="layernorm", bias=False),
            block=BlockConfig(kind="pre"),
            position=POSITION_OPTIONS.make(kind="alibi"),
            attention=AttentionConfig(
                qkv_bias=False,
                out_bias=False,
                dropout=float(a.attn_pdrop),
                clip_qkv=clip,
                scale=None if a.softmax_scale is None else float(a.softmax_scale),
            ),
            mlp=mlp_section("gelu", d_ff=4 * c.d_model, bias=False, approximate="none"),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "transformer.wte")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"transformer.blocks.{i}"
            t.add(f"{b}.attn_norm", f"{h}.norm_1")
            t.add(f"{b}.attn.qkv", f"{h}.attn.Wqkv")
            t.add(f"{b}.attn.proj", f"{h}.attn.out_proj")
            t.add(f"{b}.mlp_norm", f"{h}.norm_2")
            t.add(f"{b}.mlp.fc", f"{h}.ffn.up_proj")
            t.add(f"{b}.mlp.proj", f"{h}.ffn.down_proj")
        t.add("final_norm", "transformer.norm_f")
        return t.head()


RECORDS: tuple[Family, ...] = (Mpt(),)
