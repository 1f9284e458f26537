"""DiffLlama (DiffLlamaForCausalLM): LLaMA's layers with differential attention (``attention.kind:
differential``), its λ vectors ``lambda_q1``, ``lambda_k1``, ``lambda_q2``, ``lambda_k2`` per layer."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family
from archlab.interop.families.llama import _LlamaStyle
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.differential import DifferentialConfig

LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


class DiffLlama(_LlamaStyle):
    """DiffLlamaForCausalLM: pre-norm RMSNorm, RoPE, differential attention (one attention_bias flag for q/k/v
    and output), a bias-free gated MLP."""

    parts = "LLaMA's layers with differential attention (λ per layer, head-pair RMSNorm)"
    model_type, title, model_class, config_class = "diffllama", "DiffLlama", "DiffLlamaForCausalLM", "DiffLlamaConfig"
    attention_kind = "differential"

    def attention_to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return {"attention_bias": cfg.attention.qkv_bias, "lambda_std_dev": cfg.attention.lambda_std}

    def attention_from_hf(self, c: Any, hd: int) -> DifferentialConfig:
        if c.attention_dropout:
            refuse_hf(c, "attention_dropout", "0 (differential attention has no dropout of its maps)")
        bias = bool(c.attention_bias)
        heads = c.num_key_value_heads or c.num_attention_heads
        return DifferentialConfig(
            n_kv_head=heads, head_dim=hd, qkv_bias=bias, out_bias=bias, lambda_std=float(c.lambda_std_dev)
        )

    def attention_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        super().attention_tensors(t, archlab, hf)
        t.maps += [TensorMap(f"{archlab}.{name}", (f"{hf}.{name}",)) for name in LAMBDAS]


RECORDS: tuple[Family, ...] = (DiffLlama(),)
