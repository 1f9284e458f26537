"""The LLaMA layout and its relatives: LLaMA, Mistral, Qwen2, Qwen3, Gemma, Gemma 2 and OLMo 2
(RMSNorm, a gated MLP, full half-paired RoPE, separate q/k/v)."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    BlockConfig,
    MixerConfig,
    MLPConfig,
    ModelConfig,
    NormConfig,
    n_kv_head,
)
from archlab.interop.families.base import (
    GATED_TO_HF,
    NO_HEAD_BIAS,
    ONE_BIAS_FLAG,
    Family,
    Problem,
    Rule,
    TensorMap,
    Tensors,
    config_head_dim,
    gated_mlp,
    out_bias,
    refuse_hf,
)
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.windows import layer_types, sliding_to_hf, uniform_window
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


class _LlamaStyle(Family):
    """What LLaMA, Mistral, Qwen2, Qwen3, Gemma, Gemma 2 and OLMo 2 share: the names
    (``model.layers.i.self_attn.q_proj`` ...), RMSNorm, a gated MLP, full half-paired RoPE, no head bias,
    no embedding or residual dropout. Each sets its block's norms (archlab name -> HF name), the
    activation's config key, and its own biases, windows, norms and scales."""

    prefix = "model."
    block = "pre"
    norms = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
    activation = "hidden_act"  # the config key of the MLP's activation
    mlp_kinds: tuple[str, ...] = ("swiglu", "geglu")  # the model.mlp.kind values its MLP holds
    mlp_why = ""  # why, in its refusal
    keys = {**LLAMA_KEYS, "rms_norm_eps": "norm.eps"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", (self.block,), ""),
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.kind", self.mlp_kinds, self.mlp_why),
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
        return super().part_problems(cfg) + self.full_rotary(cfg)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return {
            **self.keys_to_hf(cfg),
            "intermediate_size": d_ff(cfg),
            "num_key_value_heads": n_kv_head(cfg),
            "head_dim": head_dim(cfg),
            self.activation: self.activation_to_hf(cfg),
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
            mlp=self.mlp_from_hf(c),
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
            self.mlp_tensors(t, f"{b}.mlp", f"{h}.mlp")
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

    def activation_to_hf(self, cfg: ModelConfig) -> str:
        """The value of the ``activation`` key: a gated MLP's."""
        return GATED_TO_HF[(cfg.mlp.kind, cfg.mlp.approximate)]

    def mlp_from_hf(self, c: Any) -> MLPConfig:
        """archlab's MLP of the config: a gated one."""
        return gated_mlp(c, self.activation)

    def mlp_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        """A gated MLP: ``gate_proj`` and ``up_proj`` (archlab's fused ``gate_up``), ``down_proj``."""
        t.gate_up(f"{archlab}.gate_up", hf, t.cfg.mlp.bias)
        t.add(f"{archlab}.down", f"{hf}.down_proj", t.cfg.mlp.bias)


class Llama(_LlamaStyle):
    """LlamaForCausalLM: pre-norm, q/k/v and output biases together (``attention_bias``), MLP biases
    (``mlp_bias``), RoPE scaling (linear, llama3: Llama 3.1)."""

    parts = "pre-norm RMSNorm, RoPE (linear, llama3), GQA, SwiGLU/GeGLU, optional biases"

    model_type, title, model_class, config_class = "llama", "LLaMA", "LlamaForCausalLM", "LlamaConfig"
    features = frozenset({"model.position.scaling"})

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
    features = frozenset({"model.position.scaling", "model.attention.window"})

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


class _Sliding(_LlamaStyle):
    """Qwen2 and Qwen3: a sliding window on every layer or none (``hf_layered``'s records of these
    families read and write layers that differ, from ``layer_types``)."""

    features = frozenset({"model.position.scaling", "model.attention.window"})

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        window = cfg.attention.window
        return dict(
            super().to_hf(cfg),
            use_sliding_window=window is not None,
            sliding_window=window,
            max_window_layers=0 if window is not None else cfg.n_layer,
            layer_types=layer_types([cfg] * cfg.n_layer),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.attention.window = uniform_window(c)
        return cfg


class Qwen2(_Sliding):
    """Qwen2ForCausalLM (Qwen2, Qwen2.5): LLaMA's layers with biases on q/k/v only; sliding windows."""

    parts = "LLaMA's layers with q/k/v biases; sliding windows"

    model_type, title, model_class, config_class = "qwen2", "Qwen2", "Qwen2ForCausalLM", "Qwen2Config"

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.attention.qkv_bias", (True,), " (q/k/v always have biases)"),
            out_bias(False, " (o_proj has no bias)"),
            ("model.mlp.bias", (False,), ""),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        del kwargs["attention_bias"]
        return kwargs

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.attention.qkv_bias, cfg.attention.out_bias = True, False
        return cfg


class Qwen3(_Sliding):
    """Qwen3ForCausalLM: LLaMA's layers with a per-head RMSNorm of q and k before RoPE, an explicit
    head_dim; sliding windows."""

    parts = "LLaMA's layers with per-head QK RMSNorm; sliding windows"

    model_type, title, model_class, config_class = "qwen3", "Qwen3", "Qwen3ForCausalLM", "Qwen3Config"
    features = _Sliding.features | {"model.attention.qk_norm"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)")]

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.attention.qk_norm = "head"
        return cfg


class Gemma(_LlamaStyle):
    """GemmaForCausalLM: LLaMA's layers with RMSNorm scales stored as w and applied as (1 + w), token
    embeddings times sqrt(d_model), and (in the published models) a tanh-approximate GeGLU."""

    parts = "RMSNorm (1 + w), scaled embeddings, GeGLU, MQA/GQA, tied head"

    model_type, title, model_class, config_class = "gemma", "Gemma", "GemmaForCausalLM", "GemmaConfig"
    features = frozenset({"model.position.scaling", "model.norm.unit_offset", "model.scale_embedding"})

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            ("model.norm.unit_offset", (True,), " (norm scales are 1 + w)"),
            ("model.scale_embedding", (True,), " (embeddings are multiplied by sqrt(d_model))"),
        ]

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.norm.unit_offset, cfg.scale_embedding = True, True
        return cfg


class Gemma2(Gemma):
    """Gemma2ForCausalLM: Gemma with a norm before and after each sublayer (sandwich), an attention scale
    query_pre_attn_scalar^-0.5, attention and final logits soft-capped, sliding windows on some layers."""

    parts = "Gemma's parts in a sandwich block, soft-capping, query scale, local/global windows"

    model_type, title, model_class, config_class = "gemma2", "Gemma 2", "Gemma2ForCausalLM", "Gemma2Config"
    block = "sandwich"
    norms = {
        "attn_norm": "input_layernorm",
        "attn_out_norm": "post_attention_layernorm",
        "mlp_norm": "pre_feedforward_layernorm",
        "mlp_out_norm": "post_feedforward_layernorm",
    }
    activation = "hidden_activation"
    features = Gemma.features | {
        "model.attention.scale",
        "model.attention.softcap",
        "model.head.softcap",
        "model.attention.window",
    }

    # what model.attention.scale must be: Gemma 2 stores the scale as query_pre_attn_scalar
    SCALE_WANTS = "null, or n^-0.5 for a whole number n (Gemma 2's query_pre_attn_scalar)"

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        scale = cfg.attention.scale
        if self._query_scalar(cfg) is None:
            return [*super().part_problems(cfg), Problem("model.attention.scale", scale, self.SCALE_WANTS)]
        return super().part_problems(cfg)

    @staticmethod
    def _query_scalar(cfg: ModelConfig) -> int | None:
        """query_pre_attn_scalar n, whose n^-0.5 is the attention scale (head_dim when scale is null);
        None when the scale is no such power."""
        scale = cfg.attention.scale
        if scale is None:
            return head_dim(cfg)
        n = round(scale**-2)
        return n if n >= 1 and n**-0.5 == scale else None

    def query_scalar(self, cfg: ModelConfig) -> int:
        """``_query_scalar``, refusing a scale that is no n^-0.5."""
        n = self._query_scalar(cfg)
        if n is None:
            raise self.refusal(Problem("model.attention.scale", cfg.attention.scale, self.SCALE_WANTS))
        return n

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        a = cfg.attention
        return dict(
            super().to_hf(cfg),
            query_pre_attn_scalar=self.query_scalar(cfg),
            attn_logit_softcapping=a.softcap,
            final_logit_softcapping=cfg.head.softcap,
            # transformers builds the sliding mask even when no layer slides: give it the context then
            **sliding_to_hf(cfg, [cfg] * cfg.n_layer),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        a = cfg.attention
        a.scale = c.query_pre_attn_scalar**-0.5
        a.softcap, cfg.head.softcap = c.attn_logit_softcapping, c.final_logit_softcapping
        a.window = uniform_window(c)
        return cfg


class Olmo2(_LlamaStyle):
    """Olmo2ForCausalLM: each sublayer's output RMSNormed before the residual add (no norm before a
    sublayer), q and k RMSNormed over the whole projection before RoPE."""

    parts = "post_sublayer block (norms after each sublayer), QK RMSNorm over the projection"

    model_type, title, model_class, config_class = "olmo2", "OLMo 2", "Olmo2ForCausalLM", "Olmo2Config"
    block = "post_sublayer"
    norms = {"attn_out_norm": "post_attention_layernorm", "mlp_out_norm": "post_feedforward_layernorm"}
    features = frozenset({"model.position.scaling", "model.attention.qk_norm"})

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [("model.attention.qk_norm", ("full",), " (q_norm and k_norm span the projection)")]

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.attention.qk_norm = "full"
        return cfg


# Qwen2, Qwen3 and Gemma2 are parts of their records in ``layered`` (whose layers may differ)
RECORDS: tuple[Family, ...] = (Llama(), Mistral(), Gemma(), Olmo2())
