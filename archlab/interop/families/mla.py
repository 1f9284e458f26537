"""Multi-head latent attention beyond DeepSeek's own classes: GLM-4.7-Flash (``glm4_moe_lite``:
DeepSeek-V3's attention and routing, its dense layers by ``mlp_layer_types``), Sarvam MLA (DeepSeek-V3's own
class under another ``model_type``) and Youtu-LLM (DeepSeek-V3's attention over a dense gated MLP in every
layer). Layouts of the first two route to DeepSeek-V3 (``moe.sparse_family``) and export there; a Youtu
layout (mla with no MoE) to Youtu, the one family that holds it."""

from __future__ import annotations

from typing import Any

from archlab.config import BlockConfig, ModelConfig, NormConfig
from archlab.interop.families.base import NO_HEAD_BIAS, Family, Rule
from archlab.interop.families.deepseek import (
    LATENT_EPS,
    MLA_KEYS,
    DeepseekV3,
    _DeepSeek,
    latent_eps_from_hf,
    latent_eps_rule,
    mla_tensors,
)
from archlab.interop.families.layered import view
from archlab.interop.families.llama import LLAMA_KEYS
from archlab.interop.families.mlps import GATED_TO_HF, activation, gated_mlp
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.sigmoid_moe import dense_prefix, mlp_layer_types
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.mla import MLAConfig
from archlab.nn.mlp import d_ff


class Glm4MoeLite(_DeepSeek):
    """Glm4MoeLiteForCausalLM (GLM-4.7-Flash): DeepSeek-V3's latent attention, routing, shared experts and
    RoPE (whole ``qk_rope_head_dim``, interleaved or halves by ``rope_interleave``), the layers
    ``mlp_layer_types`` marks dense first; its config has no ``topk_method`` or ``first_k_dense_replace``."""

    model_type, title, model_class, config_class = (
        "glm4_moe_lite",
        "GLM-4.7-Flash (GLM-4 MoE Lite)",
        "Glm4MoeLiteForCausalLM",
        "Glm4MoeLiteConfig",
    )
    parts = "DeepSeek-V3's parts (MLA, sigmoid MoE with correction bias, groups, shared experts, dense first layers)"

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        for key in ("first_k_dense_replace", "scoring_func", "topk_method", "num_mtp_layers"):
            del kwargs[key]
        return dict(kwargs, mlp_layer_types=mlp_layer_types(cfg))

    def from_hf(self, c: Any) -> ModelConfig:
        return super().from_hf(view(c, first_k_dense_replace=dense_prefix(c)))


class SarvamMla(DeepseekV3):
    """Sarvam MLA (``sarvam_mla``): DeepSeek-V3's own class, DeepseekV3ForCausalLM, its config under another name;
    its checkpoints' multi-token prediction layers (``num_mtp_layers``) read and written as DeepSeek-V3's."""

    model_type, title, model_class, config_class = (
        "sarvam_mla",
        "Sarvam (MLA)",
        "DeepseekV3ForCausalLM",
        "SarvamMLAConfig",
    )
    parts = "DeepSeek-V3's parts (its class DeepseekV3ForCausalLM)"


class Youtu(Family):
    """YoutuForCausalLM (Youtu-LLM): LLaMA's pre-norm RMSNorm block with DeepSeek-V3's latent attention
    (queries direct or through ``q_lora_rank``, latent norms at 1e-6, RoPE pairs by ``rope_interleave``,
    YaRN as DeepSeek reads it) and a gated MLP of ``intermediate_size`` without biases in every layer."""

    model_type, title, model_class, config_class = "youtu", "Youtu-LLM", "YoutuForCausalLM", "YoutuConfig"
    keys = {
        **LLAMA_KEYS,
        "rms_norm_eps": "norm.eps",
        **MLA_KEYS,
    }
    prefix = "model."
    attention_kind = "mla"
    position_why = " (it always rotates qk_rope_head_dim dims)"
    features = frozenset({"model.position.scaling.kind", "model.position.scaling.truncate", LATENT_EPS})
    scalings = ("none", "yarn")
    parts = "MLA (DeepSeek-V3's) with a dense gated MLP in every layer"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            latent_eps_rule(cfg),
            ("model.block.kind", ("pre",), ""),
            NO_HEAD_BIAS,
            ("model.mlp.kind", ("swiglu", "geglu"), " (its MLP is gated)"),
            ("model.mlp.bias", (False,), " (its MLP has no biases)"),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        a = cfg.attention
        return dict(
            self.keys_to_hf(cfg),
            intermediate_size=d_ff(cfg),
            num_key_value_heads=a.n_head,
            hidden_act=GATED_TO_HF[activation(cfg.mlp)],
            rope_parameters=rope_to_hf(cfg),
            rope_interleave=cfg.position.pairing == "interleaved",
            attention_bias=False,
            attention_dropout=a.dropout,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.attention_bias:
            refuse_hf(c, "attention_bias", "false (archlab's mla projections have no biases)")
        if c.num_key_value_heads not in (None, c.num_attention_heads):
            refuse_hf(
                c, "num_key_value_heads", f"num_attention_heads={c.num_attention_heads} (every head reads the latent)"
            )
        rope_types = tuple("default" if s == "none" else s for s in self.scalings)
        position = rope_from_hf(c, c.qk_rope_head_dim, partial=False, scalings=rope_types)
        position.pairing = "interleaved" if c.rope_interleave else "half"
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind="pre"),
            position=position,
            attention=MLAConfig(
                dropout=float(c.attention_dropout),
                latent_norm_eps=latent_eps_from_hf(c),
            ),
            mlp=gated_mlp(c, "hidden_act"),
        )
        return self.keys_from_hf(c, cfg)

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm")
            t.add(f"{b}.mlp_norm", f"{h}.post_attention_layernorm")
            mla_tensors(t, f"{b}.attn", f"{h}.self_attn")
            t.gate_up(f"{b}.mlp.gate_up", f"{h}.mlp", False)
            t.add(f"{b}.mlp.down", f"{h}.mlp.down_proj")
        t.add("final_norm", "model.norm")
        return t.head()


RECORDS: tuple[Family, ...] = (Glm4MoeLite(), SarvamMla(), Youtu())
