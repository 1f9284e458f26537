"""BitNet b1.58 (``BitNetForCausalLM``): LLaMA's layers with a norm on the heads' output before ``o_proj``
(``attn_sub_norm``: ``model.attention.sub_norm``) and on the gated MLP's hidden activations before
``down_proj`` (``ffn_sub_norm``: ``model.mlp.sub_norm``), gated through the squared ReLU (``relu2``:
``model.mlp.kind: relu2_glu``). Its checkpoints' ternary weights are a load-time quantisation
(``quantization_config``, BitLinear): transformers' class built from a config without one runs plain Linear
layers, which is what converts; the quantisation itself is not modelled."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Rule
from archlab.interop.families.llama import GATED, MLPForm, _LlamaStyle
from archlab.interop.families.mlps import GATED_FROM_HF, GATED_TO_HF, mlp_section
from archlab.interop.families.tensors import Tensors
from archlab.interop.families.values import refuse_hf

# its gated MLPs' activations: the squared ReLU (its own) beside LLaMA's
BITNET_FROM_HF = {**GATED_FROM_HF, "relu2": ("relu2_glu", "none")}
BITNET_TO_HF = {**GATED_TO_HF, ("relu2_glu", "none"): "relu2"}


def sub_normed_mlp(c: Any, act: str) -> Any:
    """down(sub_norm(act(gate(x)) * up(x))) without biases, its activation read from the config key ``act``."""
    name = getattr(c, act)
    if name not in BITNET_FROM_HF:
        refuse_hf(c, act, f"one of {sorted(BITNET_FROM_HF)}")
    kind, approximate = BITNET_FROM_HF[name]
    return mlp_section(kind, d_ff=c.intermediate_size, bias=False, approximate=approximate, sub_norm=True)


def sub_normed_tensors(t: Tensors, archlab: str, hf: str) -> None:
    """The gated MLP's tensors and its ``ffn_sub_norm``."""
    GATED.tensors(t, archlab, hf)
    t.add(f"{archlab}.sub_norm", f"{hf}.ffn_sub_norm")


SUB_NORMED = MLPForm(
    ("relu2_glu", "swiglu", "geglu"), " (its MLP is gated)", BITNET_TO_HF, sub_normed_mlp, sub_normed_tensors
)


class BitNet(_LlamaStyle):
    """BitNetForCausalLM: LLaMA's names, norms, RoPE and one ``attention_bias`` flag, an RMSNorm over the
    heads' output (``attn_sub_norm``, hidden_size wide: heads of d_model / n_head) and over the gated
    MLP's hidden activations (``ffn_sub_norm``), no MLP biases."""

    model_type, title, model_class, config_class = "bitnet", "BitNet b1.58", "BitNetForCausalLM", "BitNetConfig"
    parts = "LLaMA's layers with RMSNorm sub-norms before o_proj and down_proj, a squared-ReLU gated MLP"
    features = frozenset({"model.position.scaling.kind", "model.attention.sub_norm", "model.mlp.sub_norm"})
    mlp_form = SUB_NORMED

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        H, d = cfg.attention.n_head, cfg.d_model
        return [
            *super().rules(cfg),
            ("model.attention.sub_norm", (True,), " (attn_sub_norm before o_proj)"),
            ("model.mlp.sub_norm", (True,), " (ffn_sub_norm before down_proj)"),
            ("model.attention.head_dim", (None, d // H), f" ({self.title}'s attn_sub_norm is hidden_size wide)"),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        del kwargs["head_dim"]  # BitNetConfig has none: d_model / n_head
        return kwargs

    def from_hf(self, c: Any) -> ModelConfig:
        if getattr(c, "quantization_config", None):
            refuse_hf(c, "quantization_config", "none (archlab does not model ternary BitLinear weights)")
        cfg = super().from_hf(c)
        cfg.attention.sub_norm = True
        return cfg

    def attention_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        super().attention_tensors(t, archlab, hf)
        t.add(f"{archlab}.sub_norm", f"{hf}.attn_sub_norm")


RECORDS: tuple[Family, ...] = (BitNet(),)
