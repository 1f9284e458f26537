"""OLMo 2 (``Olmo2ForCausalLM``): LLaMA's parts in post-sublayer blocks with a QK-norm."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    ModelConfig,
)
from archlab.interop.families.base import (
    Family,
    Rule,
)
from archlab.interop.families.llama import _LlamaStyle


class Olmo2(_LlamaStyle):
    """Olmo2ForCausalLM: each sublayer's output RMSNormed before the residual add (no norm before a
    sublayer), q and k RMSNormed over the whole projection before RoPE."""

    parts = "post_sublayer block (norms after each sublayer), QK RMSNorm over the projection"

    model_type, title, model_class, config_class = "olmo2", "OLMo 2", "Olmo2ForCausalLM", "Olmo2Config"
    block = "post_sublayer"
    norms = {"attn_out_norm": "post_attention_layernorm", "mlp_out_norm": "post_feedforward_layernorm"}
    features = frozenset({"model.position.scaling.kind", "model.attention.qk_norm"})

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [("model.attention.qk_norm", ("full",), " (q_norm and k_norm span the projection)")]

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.attention.qk_norm = "full"
        return cfg


RECORDS: tuple[Family, ...] = (Olmo2(),)
