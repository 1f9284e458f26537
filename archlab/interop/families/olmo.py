"""OLMo 1 (OlmoForCausalLM: OLMo-1B, OLMo-7B, OLMo-1.7): LLaMA's layers with LayerNorms that learn
nothing (``model.norm.affine: false``) and q, k, v clamped as projected (``clip_qkv``)."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig, NormConfig
from archlab.interop.families.base import Family, Rule
from archlab.interop.families.llama import LLAMA_KEYS, _LlamaStyle
from archlab.interop.families.phi3 import fixed_head_dim, head_dim_rule
from archlab.interop.families.tensors import TensorMap, Tensors

EPS = 1e-5  # OlmoLayerNorm's eps, fixed in transformers


class Olmo(_LlamaStyle):
    """OlmoForCausalLM: pre-norm LayerNorms without weight or bias (eps 1e-5, not configurable), a gated
    MLP, full half-paired RoPE, one ``attention_bias`` for q/k/v and output, and ``clip_qkv``."""

    model_type, title, model_class, config_class = "olmo", "OLMo", "OlmoForCausalLM", "OlmoConfig"
    features = frozenset({"model.position.scaling.kind", "model.norm.affine", "model.attention.clip_qkv"})
    parts = "LLaMA's layers with parameter-free LayerNorms (model.norm.affine false), clip_qkv"
    keys = LLAMA_KEYS  # OlmoConfig has no rms_norm_eps

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        rules = [r for r in super().rules(cfg) if r[0] != "model.norm.kind"]
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.affine", (False,), " (OLMo's LayerNorms have no weight or bias)"),
            ("model.norm.eps", (EPS,), " (OLMo's LayerNorm eps is fixed)"),
            *rules,
            head_dim_rule(cfg, self.title),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        del kwargs["head_dim"]  # OlmoConfig has none
        return dict(kwargs, clip_qkv=cfg.attention.clip_qkv)

    def from_hf(self, c: Any) -> ModelConfig:
        fixed_head_dim(c)
        cfg = super().from_hf(c)
        cfg.norm = NormConfig(kind="layernorm", eps=EPS, affine=False)
        cfg.attention.head_dim = None
        cfg.attention.clip_qkv = None if c.clip_qkv is None else float(c.clip_qkv)
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, a = Tensors(cfg), cfg.attention
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):  # the LayerNorms hold no tensors
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", a.qkv_bias)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj", a.out_bias)
            t.gate_up(f"{b}.mlp.gate_up", f"{h}.mlp", False)
            t.add(f"{b}.mlp.down", f"{h}.mlp.down_proj")
        return t.head()


RECORDS: tuple[Family, ...] = (Olmo(),)
