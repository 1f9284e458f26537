"""HunYuan dense (``HunYuanDenseV1ForCausalLM``): LLaMA's layers with q and k RMSNormed per head after
RoPE."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Rule
from archlab.interop.families.layered import view
from archlab.interop.families.llama import _LlamaStyle
from archlab.interop.families.tensors import TensorMap
from archlab.interop.families.values import config_head_dim, refuse_hf

# transformers' names of the QK-norms, by archlab's
_QK_NORMS = {".self_attn.q_norm.": ".self_attn.query_layernorm.", ".self_attn.k_norm.": ".self_attn.key_layernorm."}


class HunYuanDense(_LlamaStyle):
    """HunYuanDenseV1ForCausalLM: pre-norm RMSNorm, a gated MLP without biases, q/k/v and output biases
    together (``attention_bias``), and a per-head RMSNorm of the rotated q and k (``query_layernorm``,
    ``key_layernorm``). The published models' ``rope_type: dynamic`` with an ``alpha`` is a fixed NTK base,
    ``rope_theta · alpha^(head_dim / (head_dim - 2))``, which archlab holds as its ``theta``."""

    model_type, title = "hunyuan_v1_dense", "HunYuan dense"
    model_class, config_class = "HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config"
    features = frozenset(
        {"model.position.scaling.kind", "model.attention.qk_norm", "model.attention.qk_norm_after_rope"}
    )
    parts = "pre-norm RMSNorm, per-head QK-norm after RoPE, SwiGLU, attention biases, GQA"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            ("model.attention.qk_norm", ("head",), " (query_layernorm and key_layernorm span one head)"),
            ("model.attention.qk_norm_after_rope", (True,), " (HunYuan norms the rotated q and k)"),
        ]

    def from_hf(self, c: Any) -> ModelConfig:
        hd = config_head_dim(c)
        cfg = super().from_hf(view(c, rope_parameters=self._fixed_rope(c, hd)))
        cfg.attention.qk_norm, cfg.attention.qk_norm_after_rope = "head", True
        return cfg

    @staticmethod
    def _fixed_rope(c: Any, hd: int) -> Any:
        """``rope_parameters``, with the fixed-alpha NTK base (``dynamic`` with ``alpha``) as a plain RoPE
        of that base (transformers reads nothing else of it)."""
        rope = dict(getattr(c, "rope_parameters", None) or {})
        if rope.get("rope_type", rope.get("type")) != "dynamic" or not rope.get("alpha"):
            return rope
        if getattr(c, "head_dim", None) is None:
            refuse_hf(c, "head_dim", "an int with rope_parameters.alpha (transformers' NTK base reads it)")
        return {"rope_type": "default", "rope_theta": rope["rope_theta"] * rope["alpha"] ** (hd / (hd - 2))}

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        maps = super().tensors(cfg)
        for ours, theirs in _QK_NORMS.items():
            maps = [m._replace(hf=tuple(n.replace(ours, theirs) for n in m.hf)) for m in maps]
        return maps


RECORDS: tuple[Family, ...] = (HunYuanDense(),)
