"""ERNIE 4.5, dense (``Ernie4_5ForCausalLM``): LLaMA's layers with adjacent dims paired by RoPE and one
``use_bias`` flag for every projection."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Rule, out_bias
from archlab.interop.families.layered import view
from archlab.interop.families.llama import _LlamaStyle
from archlab.interop.families.values import refuse_hf


class Ernie45(_LlamaStyle):
    """Ernie4_5ForCausalLM: pre-norm RMSNorm, a gated MLP, RoPE over whole heads pairing dims 2i and 2i+1,
    biases on q/k/v, o_proj and the MLP together or nowhere (``use_bias``), no attention dropout."""

    model_type, title, model_class, config_class = "ernie4_5", "ERNIE 4.5", "Ernie4_5ForCausalLM", "Ernie4_5Config"
    features = frozenset({"model.position.scaling.kind"})
    parts = "pre-norm RMSNorm, interleaved RoPE, SwiGLU, biases everywhere or nowhere (use_bias), GQA"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        pairing = ("model.position.pairing", ("interleaved",), " (ERNIE 4.5 rotates adjacent dims together)")
        return [pairing if r[0] == pairing[0] else r for r in super().rules(cfg)] + [
            ("model.attention.dropout", (0.0,), " (ERNIE 4.5's attention has no dropout)")
        ]

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        why = " (one use_bias flag sets q/k/v, o_proj and the MLP)"
        return [
            out_bias(cfg.attention.qkv_bias, why),
            ("model.mlp.bias", (cfg.attention.qkv_bias,), why),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        del kwargs["attention_bias"], kwargs["attention_dropout"]  # Ernie4_5Config has neither
        return dict(kwargs, use_bias=cfg.attention.qkv_bias)

    def from_hf(self, c: Any) -> ModelConfig:
        bias = c.use_bias
        if bias not in (None, False, True):
            refuse_hf(c, "use_bias", "true, false or null (false)")
        cfg = super().from_hf(view(c, attention_dropout=0.0, attention_bias=bool(bias)))
        cfg.position.pairing, cfg.mlp.bias = "interleaved", bool(bias)
        return cfg


RECORDS: tuple[Family, ...] = (Ernie45(),)
