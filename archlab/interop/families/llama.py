"""The LLaMA layout (RMSNorm, a gated MLP, full half-paired RoPE, separate q/k/v): ``_LlamaStyle``, which
its relatives extend (``qwen2``, ``gemma``, ``olmo2`` ...), and the records of LLaMA and Mistral."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from archlab.config import (
    BlockConfig,
    MixerConfig,
    ModelConfig,
    NormConfig,
    n_kv_head,
)
from archlab.interop.families.base import NO_HEAD_BIAS, ONE_BIAS_FLAG, Check, Family, Problem, Rule, out_bias
from archlab.interop.families.mlps import GATED_TO_HF, activation, gated_mlp
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import config_head_dim, refuse_hf
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff

# ---- the LLaMA layout and its relatives: RMSNorm, gated MLP, full half-paired RoPE, separate q/k/v

# The config keys LLaMA's relatives share, copied as they are (``Family.keys``).
LLAMA_KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layer",
    "num_attention_heads": "attention.n_head",
    "max_position_embeddings": "context_length",
    "initializer_range": "init_std",
    "tie_word_embeddings": "head.tied",
}


class MLPForm(NamedTuple):
    """How a LLaMA-style family's MLP converts: the ``model.mlp.kind`` values it holds (``why``, in a
    refusal), its activation's Hugging Face name by archlab's (kind, approximate), archlab's section of a
    transformers config (given the activation's config key) and its tensors (archlab's MLP, HF's MLP)."""

    kinds: tuple[str, ...]
    why: str
    to_hf: dict[tuple[str, str], str]
    from_hf: Callable[[Any, str], Any]
    tensors: Callable[[Tensors, str, str], None]


def gated_tensors(t: Tensors, archlab: str, hf: str) -> None:
    """A gated MLP: ``gate_proj`` and ``up_proj`` (archlab's fused ``gate_up``), ``down_proj``."""
    t.gate_up(f"{archlab}.gate_up", hf, t.cfg.mlp.bias)
    t.add(f"{archlab}.down", f"{hf}.down_proj", t.cfg.mlp.bias)


GATED = MLPForm(("swiglu", "geglu"), "", GATED_TO_HF, gated_mlp, gated_tensors)


class _LlamaStyle(Family):
    """What LLaMA, Mistral, Qwen2, Qwen3, Gemma, Gemma 2 and OLMo 2 share: the names
    (``model.layers.i.self_attn.q_proj`` ...), RMSNorm, a gated MLP, full half-paired RoPE, no head bias,
    no embedding or residual dropout. Each sets its block's norms (archlab name -> HF name), the
    activation's config key, and its own biases, windows, norms and scales."""

    prefix = "model."
    block = "pre"
    norms = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
    activation = "hidden_act"  # the config key of the MLP's activation
    mlp_form = GATED  # its MLP (Arcee's and its relatives': up/down)
    checks: tuple[Check, ...] = (Family.full_rotary,)  # after its rules' problems, in order
    keys = {**LLAMA_KEYS, "rms_norm_eps": "norm.eps"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", (self.block,), ""),
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.kind", self.mlp_form.kinds, self.mlp_form.why),
            NO_HEAD_BIAS,
            *self.bias_rules(cfg),
        ]

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        """Most families have one attention_bias flag for q/k/v and output, and no MLP biases."""
        return [
            out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG),
            ("model.mlp.bias", (False,), ""),
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        return super().part_problems(cfg) + [p for check in self.checks for p in check(cfg)]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return {
            **self.keys_to_hf(cfg),
            "intermediate_size": d_ff(cfg),
            "num_key_value_heads": n_kv_head(cfg),
            "head_dim": head_dim(cfg),
            self.activation: self.mlp_form.to_hf[activation(cfg.mlp)],
            "rope_parameters": rope_to_hf(cfg),
            **self.attention_to_hf(cfg),
        }

    def attention_to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        """The attention's own config keys: its dropout and one bias flag."""
        return {"attention_dropout": cfg.attention.dropout, "attention_bias": cfg.attention.qkv_bias}

    def from_hf(self, c: Any) -> ModelConfig:
        if getattr(c, "use_bidirectional_attention", None):
            refuse_hf(c, "use_bidirectional_attention", "false (archlab attention is causal)")
        hd = config_head_dim(c)
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="rmsnorm"),
            block=BlockConfig(kind=self.block),
            position=rope_from_hf(c, hd, partial=False),
            attention=self.attention_from_hf(c, hd),
            mlp=self.mlp_form.from_hf(c, self.activation),
        )
        return self.keys_from_hf(c, cfg)

    def attention_from_hf(self, c: Any, hd: int) -> MixerConfig:
        """archlab's attention of the config: causal, heads of ``hd``, one bias flag."""
        bias = bool(getattr(c, "attention_bias", False))
        return AttentionConfig(
            n_kv_head=c.num_key_value_heads or c.num_attention_heads,
            head_dim=hd,
            qkv_bias=bias,
            out_bias=bias,
            dropout=float(c.attention_dropout),
        )

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            for archlab, hf in self.norms.items():
                t.add(f"{b}.{archlab}", f"{h}.{hf}")
            self.attention_tensors(t, f"{b}.attn", f"{h}.self_attn")
            self.mlp_form.tensors(t, f"{b}.mlp", f"{h}.mlp")
        t.add("final_norm", "model.norm")
        return t.head()

    def attention_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        """q_proj, k_proj and v_proj (archlab's fused ``qkv``), any QK-norms (a mixer without the field has
        none), o_proj."""
        a = t.cfg.attention
        t.qkv(f"{archlab}.qkv", hf, a.qkv_bias)
        if getattr(a, "qk_norm", "none") != "none":
            t.add(f"{archlab}.q_norm", f"{hf}.q_norm")
            t.add(f"{archlab}.k_norm", f"{hf}.k_norm")
        t.add(f"{archlab}.proj", f"{hf}.o_proj", a.out_bias)


class Llama(_LlamaStyle):
    """LlamaForCausalLM: pre-norm, q/k/v and output biases together (``attention_bias``), MLP biases
    (``mlp_bias``), RoPE scaling (linear, llama3: Llama 3.1)."""

    parts = "pre-norm RMSNorm, RoPE (linear, llama3), GQA, SwiGLU/GeGLU, optional biases"

    model_type, title, model_class, config_class = "llama", "LLaMA", "LlamaForCausalLM", "LlamaConfig"
    features = frozenset({"model.position.scaling.kind"})

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:  # any model.mlp.bias: mlp_bias
        return [out_bias(cfg.attention.qkv_bias, ONE_BIAS_FLAG)]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), mlp_bias=cfg.mlp.bias)

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.mlp.bias = bool(getattr(c, "mlp_bias", False))
        return cfg


class Mistral(_LlamaStyle):
    """MistralForCausalLM: LLaMA's layers, no biases, a sliding window on every layer."""

    parts = "LLaMA's layers, no biases, a sliding window on every layer"

    model_type, title, model_class, config_class = "mistral", "Mistral", "MistralForCausalLM", "MistralConfig"
    features = frozenset({"model.position.scaling.kind", "model.attention.window"})

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.attention.qkv_bias", (False,), ""),
            out_bias(False),
            ("model.mlp.bias", (False,), ""),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        del kwargs["attention_bias"]
        return dict(kwargs, sliding_window=cfg.attention.window)

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.attention.window = c.sliding_window
        return cfg


RECORDS: tuple[Family, ...] = (
    Llama(),
    Mistral(),
)
