"""Apertus (``ApertusForCausalLM``): LLaMA's layers with a per-head RMSNorm of q and k before RoPE (as Qwen3)
and a plain MLP, ``down(xIELU(up(x)))`` (archlab's ``mlp.kind: xielu``), its norms named
``attention_layernorm`` and ``feedforward_layernorm``."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Rule
from archlab.interop.families.llama import Llama, MLPForm
from archlab.interop.families.mlps import mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.xielu import XIELUConfig

XIELU_DEFAULTS = XIELUConfig()  # transformers' XIELUActivation is built at its defaults: beta and eps fixed


def xielu_mlp(c: Any, act: str = "hidden_act") -> Any:
    """down(xIELU(up(x))), no biases."""
    if getattr(c, act) != "xielu":
        refuse_hf(c, act, "xielu (Apertus's activation)")
    return mlp_section("xielu", d_ff=c.intermediate_size, bias=False)


def xielu_tensors(t: Tensors, archlab: str, hf: str) -> None:
    """``up_proj``, ``down_proj`` and the activation's two scalars (``act_fn.alpha_p``, ``act_fn.alpha_n``)."""
    t.add(f"{archlab}.fc", f"{hf}.up_proj")
    t.add(f"{archlab}.proj", f"{hf}.down_proj")
    for name in ("alpha_p", "alpha_n"):
        t.maps.append(TensorMap(f"{archlab}.act.{name}", (f"{hf}.act_fn.{name}",)))


XIELU_FORM = MLPForm(
    ("xielu",), " (its MLP is up_proj, xIELU, down_proj)", {("xielu", "none"): "xielu"}, xielu_mlp, xielu_tensors
)


class Apertus(Llama):
    """ApertusForCausalLM: LLaMA's names but its norms', RoPE (llama3 scaling by default), one
    ``attention_bias`` flag; per-head q and k RMSNorms; the xIELU MLP without biases."""

    model_type, title, model_class, config_class = "apertus", "Apertus", "ApertusForCausalLM", "ApertusConfig"
    parts = "LLaMA's layers with per-head QK RMSNorm and an up/down xIELU MLP"
    norms = {"attn_norm": "attention_layernorm", "mlp_norm": "feedforward_layernorm"}
    mlp_form = XIELU_FORM
    features = Llama.features | {"model.attention.qk_norm"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        why = " (transformers builds its xIELU at the defaults)"
        return super().rules(cfg) + [
            ("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)"),
            ("model.mlp.bias", (False,), " (its up_proj and down_proj have none)"),
            ("model.mlp.beta", (XIELU_DEFAULTS.beta,), why),
            ("model.mlp.eps", (XIELU_DEFAULTS.eps,), why),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        out = super().to_hf(cfg)
        del out["mlp_bias"]
        return out

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.attention.qk_norm = "head"
        return cfg


class Apertus1p5(Apertus):
    """Apertus1p5TextForCausalLM: Apertus's layers over a vocabulary extended with image and audio codes, its
    head optionally pruned to the first ``output_vocab_size`` ids (archlab's ``model.head.vocab``)."""

    model_type, title = "apertus1p5_text", "Apertus 1.5"
    model_class, config_class = "Apertus1p5TextForCausalLM", "Apertus1p5TextConfig"
    parts = "Apertus's layers, its head optionally pruned to the text ids (output_vocab_size)"
    features = Apertus.features | {"model.head.vocab"}

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return super().to_hf(cfg) | {"output_vocab_size": cfg.head.vocab}

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.head.vocab = c.output_vocab_size
        return cfg


RECORDS: tuple[Family, ...] = (Apertus(), Apertus1p5())
