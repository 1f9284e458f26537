"""nanochat (``NanoChatForCausalLM``): pre-norm RMSNorms without a weight, one of them on the token embeddings,
q and k L2-normed per head after RoPE, a bias-free ReLU² MLP, soft-capped logits; its RoPE turns the
other way, which archlab's holds with the second half of each q and k head's rows negated."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    BlockConfig,
    HeadConfig,
    ModelConfig,
    NormConfig,
    n_kv_head,
)
from archlab.interop.families.arcee import UP_DOWN_FROM_HF, UP_DOWN_KINDS, UP_DOWN_TO_HF
from archlab.interop.families.base import NO_HEAD_BIAS, ONE_BIAS_FLAG, Family, Problem, Rule, out_bias
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import activation, mlp_section
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff


class NanoChat(Family):
    """NanoChatForCausalLM: pre-norm RMSNorms with no weight (``model.norm.affine`` false), the same norm on
    the token embeddings before the first block (``model.embedding_norm``), full RoPE whose
    ``rotate_half`` is (x2, -x1) (turning by -θ: archlab's RoPE of the q and k rows with each head's second
    half negated, the ``stacked_half_negated`` tensor layout, which the per-head L2 norm and the scores
    keep), q and k L2-normed per head after RoPE (``qk_norm: l2``, the model's eps), GQA, one
    ``attention_bias`` for q/k/v and output, a bias-free plain MLP (``fc1``, ``fc2``; ReLU² as published),
    logits soft-capped by ``final_logit_softcapping``, no head bias, no residual or embedding dropout."""

    model_type, title, model_class, config_class = "nanochat", "nanochat", "NanoChatForCausalLM", "NanoChatConfig"
    keys = {**LLAMA_KEYS, "rms_norm_eps": "norm.eps"}
    prefix = "model."
    features = frozenset(
        {
            "model.norm.affine",
            "model.embedding_norm",
            "model.attention.qk_norm",
            "model.head.softcap",
            "model.position.scaling.kind",
        }
    )
    parts = "weightless RMSNorms (one on the embeddings), RoPE (sign by q/k rows), l2 QK-norm, GQA, ReLU², softcap"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        a = cfg.attention
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.norm.affine", (False,), " (nanochat's RMSNorms have no weight)"),
            ("model.embedding_norm", (True,), " (nanochat norms the token embeddings)"),
            ("model.block.kind", ("pre",), ""),
            ("model.position.pairing", ("half",), ""),
            ("model.attention.qk_norm", ("l2",), " (nanochat's q_norm and k_norm have no weight)"),
            out_bias(a.qkv_bias, ONE_BIAS_FLAG),
            ("model.attention.head_dim", (None, cfg.d_model // a.n_head), " (nanochat uses d_model / n_head)"),
            ("model.mlp.kind", UP_DOWN_KINDS, ""),
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
            hidden_act=UP_DOWN_TO_HF[activation(cfg.mlp)],
            rope_parameters=rope_to_hf(cfg),
            attention_dropout=a.dropout,
            attention_bias=a.qkv_bias,
            final_logit_softcapping=cfg.head.softcap,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.hidden_act not in UP_DOWN_FROM_HF:
            refuse_hf(c, "hidden_act", f"one of {sorted(UP_DOWN_FROM_HF)}")
        hd = c.hidden_size // c.num_attention_heads
        if getattr(c, "head_dim", hd) != hd:
            refuse_hf(c, "head_dim", f"{hd} (hidden_size / num_attention_heads, as nanochat's rotary embedding reads)")
        kind, approximate = UP_DOWN_FROM_HF[c.hidden_act]
        bias = bool(c.attention_bias)
        softcap = c.final_logit_softcapping
        cfg = ModelConfig(
            dropout=0.0,
            embedding_norm=True,
            norm=NormConfig(kind="rmsnorm", affine=False),
            block=BlockConfig(kind="pre"),
            position=rope_from_hf(c, hd, partial=False),
            attention=AttentionConfig(
                n_kv_head=c.num_key_value_heads or c.num_attention_heads,
                qkv_bias=bias,
                out_bias=bias,
                dropout=float(c.attention_dropout),
                qk_norm="l2",
            ),
            mlp=mlp_section(kind, d_ff=c.intermediate_size, bias=False, approximate=approximate),
            head=HeadConfig(bias=False, softcap=None if softcap is None else float(softcap)),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, a = Tensors(cfg), cfg.attention
        hd = head_dim(cfg)
        sizes = (a.n_head * hd, n_kv_head(cfg) * hd, n_kv_head(cfg) * hd, hd)
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):  # the norms hold no tensors
            b, h = f"blocks.{i}", f"model.layers.{i}.self_attn"
            for part in ("weight", "bias") if a.qkv_bias else ("weight",):
                names = tuple(f"{h}.{x}_proj.{part}" for x in "qkv")
                t.maps.append(TensorMap(f"{b}.attn.qkv.{part}", names, "stacked_half_negated", sizes))
            t.add(f"{b}.attn.proj", f"{h}.o_proj", a.out_bias)
            t.add(f"{b}.mlp.fc", f"model.layers.{i}.mlp.fc1")
            t.add(f"{b}.mlp.proj", f"model.layers.{i}.mlp.fc2")
        return t.head()


RECORDS: tuple[Family, ...] = (NanoChat(),)
