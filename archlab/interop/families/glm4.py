"""GLM-4 (``Glm4ForCausalLM``, the 0414 models): LLaMA's names around a sandwich block of four RMSNorms,
interleaved partial RoPE, q/k/v biases and one fused gate/up projection."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Problem, Rule, out_bias
from archlab.interop.families.layered import view
from archlab.interop.families.llama import _LlamaStyle
from archlab.interop.families.rope import rope_fraction, rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim


class Glm4(_LlamaStyle):
    """Glm4ForCausalLM: each sublayer between a norm before it and one after it (``input_layernorm``,
    ``post_self_attn_layernorm``; ``post_attention_layernorm``, ``post_mlp_layernorm``), RoPE on the first
    ``partial_rotary_factor`` of each head (0.5 where absent) with adjacent dims paired, biases on q/k/v
    (``attention_bias``) and none on o_proj, the MLP's gate and up rows in one ``gate_up_proj``."""

    model_type, title, model_class, config_class = "glm4", "GLM-4", "Glm4ForCausalLM", "Glm4Config"
    block = "sandwich"
    norms = {
        "attn_norm": "input_layernorm",
        "attn_out_norm": "post_self_attn_layernorm",
        "mlp_norm": "post_attention_layernorm",
        "mlp_out_norm": "post_mlp_layernorm",
    }
    features = frozenset({"model.position.scaling.kind"})
    parts = "sandwich block of RMSNorms, interleaved partial RoPE, q/k/v biases, fused gate/up SwiGLU, GQA"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        pairing = ("model.position.pairing", ("interleaved",), " (GLM-4 rotates adjacent dims together)")
        return [pairing if r[0] == pairing[0] else r for r in super().rules(cfg)]

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [out_bias(False, " (o_proj has no bias)"), ("model.mlp.bias", (False,), "")]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return Family.part_problems(self, cfg)  # any rotary_dim: partial_rotary_factor

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), rope_parameters=rope_to_hf(cfg, rope_fraction(cfg)))

    def from_hf(self, c: Any) -> ModelConfig:
        hd = config_head_dim(c)
        cfg = super().from_hf(view(c, rope_parameters=None))
        cfg.position = rope_from_hf(c, hd, partial=True)
        cfg.position.pairing, cfg.attention.out_bias = "interleaved", False
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, a = Tensors(cfg), cfg.attention
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            for archlab, hf in self.norms.items():
                t.add(f"{b}.{archlab}", f"{h}.{hf}")
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", a.qkv_bias)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj")
            t.add(f"{b}.mlp.gate_up", f"{h}.mlp.gate_up_proj")  # [gate | up], as archlab's
            t.add(f"{b}.mlp.down", f"{h}.mlp.down_proj")
        t.add("final_norm", "model.norm")
        return t.head()


RECORDS: tuple[Family, ...] = (Glm4(),)
