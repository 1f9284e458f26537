"""GPT (``OpenAIGPTLMHeadModel``, OpenAI's GPT-1): post-norm LayerNorm blocks, learned positions, GPT-2's
Conv1D layers with biases, an MLP of 4·d_model."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    POSITION_OPTIONS,
    BlockConfig,
    ModelConfig,
    NormConfig,
    embedding_dropout,
)
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Problem, Rule, out_bias
from archlab.interop.families.gpt import GPT_KEYS
from archlab.interop.families.mlps import activation, mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import dropouts, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mlp import d_ff

# afn <-> archlab (kind, approximate): GPT's "gelu" is the tanh approximation (transformers' gelu_new)
ACT_FROM_HF = {"gelu": ("gelu", "tanh"), "relu": ("relu", "none")}
ACT_TO_HF = {v: k for k, v in ACT_FROM_HF.items()}


class OpenAIGPT(Family):
    """OpenAIGPTLMHeadModel: post-norm blocks (``ln_1(x + attn(x))``, then ``ln_2(x + mlp(x))``, no final
    norm), learned positions, Conv1D layers with biases ([Q | K | V] in ``c_attn``, as archlab's), scores
    scaled by 1/sqrt(head_dim), an MLP of 4·d_model (``afn``: tanh-GELU or ReLU), a head without bias, tied
    (``tie_word_embeddings``) as published. ``resid_pdrop`` drops each sublayer's output, ``embd_pdrop`` the embeddings,
    ``attn_pdrop`` the attention probabilities. Its causal mask adds -1e4 to the hidden scores rather than
    -inf: the same probabilities, each hidden one below e^-9000."""

    model_type, title, model_class, config_class = "openai-gpt", "GPT", "OpenAIGPTLMHeadModel", "OpenAIGPTConfig"
    keys = GPT_KEYS
    prefix = "transformer."
    features = frozenset({"model.dropout", "model.embedding_dropout"})
    position_kind = "learned"
    parts = "post-norm LayerNorm blocks, learned positions, tanh-GELU/ReLU MLP of 4·d_model, biases everywhere"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        gelu = cfg.mlp.kind == "gelu"
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.block.kind", ("post",), ""),
            ("model.mlp.kind", ("gelu", "relu"), ""),
            ("model.mlp.approximate", ("tanh",) if gelu else ("none",), " (GPT's gelu is the tanh approximation)"),
            ("model.mlp.bias", (True,), ""),
            ("model.attention.qkv_bias", (True,), " (Conv1D layers always have a bias)"),
            out_bias(True, " (Conv1D layers always have a bias)"),
            *self.mha_rules(cfg),
            NO_HEAD_BIAS,
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        found = super().part_problems(cfg)
        if cfg.mlp.kind != "none" and d_ff(cfg) != 4 * cfg.d_model:  # none: refused for its kind
            found.append(Problem("model.mlp.d_ff", d_ff(cfg), f"{4 * cfg.d_model}", " (GPT's MLP is 4·d_model wide)"))
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            self.keys_to_hf(cfg),
            afn=ACT_TO_HF[activation(cfg.mlp)],
            resid_pdrop=cfg.dropout,
            embd_pdrop=embedding_dropout(cfg),
            attn_pdrop=cfg.attention.dropout,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.afn not in ACT_FROM_HF:
            refuse_hf(c, "afn", f"one of {sorted(ACT_FROM_HF)} (archlab has no plain SiLU MLP)")
        kind, approximate = ACT_FROM_HF[c.afn]
        cfg = ModelConfig(
            **dropouts(c.resid_pdrop, c.embd_pdrop),
            norm=NormConfig(kind="layernorm", bias=True),
            block=BlockConfig(kind="post"),
            position=POSITION_OPTIONS.make(kind="learned"),
            attention=AttentionConfig(dropout=float(c.attn_pdrop)),
            mlp=mlp_section(kind, d_ff=4 * c.n_embd, bias=True, approximate=approximate),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "transformer.tokens_embed")
        t.add("position.table", "transformer.positions_embed")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"transformer.h.{i}"
            t.add(f"{b}.attn.qkv", f"{h}.attn.c_attn", True, "transposed")
            t.add(f"{b}.attn.proj", f"{h}.attn.c_proj", True, "transposed")
            t.add(f"{b}.attn_norm", f"{h}.ln_1", True)
            t.add(f"{b}.mlp.fc", f"{h}.mlp.c_fc", True, "transposed")
            t.add(f"{b}.mlp.proj", f"{h}.mlp.c_proj", True, "transposed")
            t.add(f"{b}.mlp_norm", f"{h}.ln_2", True)
        return t.head()


RECORDS: tuple[Family, ...] = (OpenAIGPT(),)
