"""Hugging Face model_types whose causal LM is another family's own class with a config of the same keys:
GPT-SW3 (``GPT2LMHeadModel``, ``GPT2Config``), EXAONE 3, InternLM3 and IQuest-Coder (``LlamaForCausalLM``
with their own config classes). Each record is its parent's with the
``model_type``, title and classes changed; a layout exports to the parent, which holds the same model."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Rule
from archlab.interop.families.gpt import GPT2
from archlab.interop.families.llama import Llama


class GptSw3(GPT2):
    """GPT-SW3: ``GPT2LMHeadModel`` with a ``GPT2Config`` whose model_type says gpt-sw3."""

    defers = True  # to GPT-2, whose class it is

    model_type, title, model_class, config_class = "gpt-sw3", "GPT-SW3", "GPT2LMHeadModel", "GPT2Config"
    parts = "GPT-2's: pre-norm LayerNorm, learned positions, GELU MLP, biases everywhere"

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), model_type=self.model_type)  # GPT2Config's own says gpt2


class Exaone(Llama):
    """EXAONE 3 (``ExaoneConfig``): ``LlamaForCausalLM``. Its checkpoints keep EXAONE's own tensor names
    (``transformer.h.i.attn.attention.q_proj``, ``ln_1``, ``mlp.c_fc_0`` ...), which transformers renames
    when loading and writes back when saving: ``renames`` (prefixes) and ``infix`` (the rest) read them."""

    defers = True  # to LLaMA, whose class it is

    model_type, title, model_class, config_class = "exaone", "EXAONE 3", "LlamaForCausalLM", "ExaoneConfig"
    parts = "LLaMA's (pre-norm RMSNorm, RoPE, GQA, SwiGLU), EXAONE's tensor names in checkpoints"
    renames = {
        "transformer.wte.": "model.embed_tokens.",
        "transformer.h.": "model.layers.",
        "transformer.ln_f.": "model.norm.",
    }
    infix = {
        ".attn.attention.out_proj.": ".self_attn.o_proj.",
        ".attn.attention.": ".self_attn.",
        ".ln_1.": ".input_layernorm.",
        ".ln_2.": ".post_attention_layernorm.",
        ".mlp.c_fc_0.": ".mlp.gate_proj.",
        ".mlp.c_fc_1.": ".mlp.up_proj.",
        ".mlp.c_proj.": ".mlp.down_proj.",
    }

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Any]) -> dict[str, Any]:
        def renamed(name: str) -> str:
            old = next((o for o in self.infix if o in name), None)
            return name if old is None else name.replace(old, self.infix[old], 1)

        return {renamed(k): v for k, v in state.items()}


class InternLM3(Llama):
    """InternLM3 (``InternLM3Config``): ``LlamaForCausalLM`` whose config refuses attention and MLP biases
    that differ (``qkv_bias`` and ``bias``, read as ``attention_bias`` and ``mlp_bias``)."""

    defers = True  # to LLaMA, whose class it is

    model_type, title, model_class, config_class = "internlm3", "InternLM3", "LlamaForCausalLM", "InternLM3Config"
    parts = "LLaMA's (pre-norm RMSNorm, RoPE, GQA, SwiGLU), attention and MLP biases together"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        why = " (InternLM3Config sets attention and MLP biases together)"
        return [*super().rules(cfg), ("model.mlp.bias", (cfg.attention.qkv_bias,), why)]


class IQuestCoder(Llama):
    """IQuest-Coder (``IQuestCoderConfig``): ``LlamaForCausalLM``."""

    defers = True  # to LLaMA, whose class it is

    model_type, title = "iquestcoder", "IQuest-Coder"
    model_class, config_class = "LlamaForCausalLM", "IQuestCoderConfig"
    parts = "LLaMA's: pre-norm RMSNorm, RoPE (linear, llama3), GQA, SwiGLU, optional biases"


RECORDS: tuple[Family, ...] = (GptSw3(), Exaone(), InternLM3(), IQuestCoder())
