"""BitNet b1.58 (``BitNetForCausalLM``): LLaMA's layers with a norm on the heads' output before ``o_proj``
(``attn_sub_norm``: ``model.attention.sub_norm``) and on the gated MLP's hidden activations before
``down_proj`` (``ffn_sub_norm``: ``model.mlp.sub_norm``), gated through the squared ReLU (``relu2``:
``model.mlp.kind: relu2_glu``). A ``quantization_config`` (quant_method ``bitnet``) makes the layers'
projections BitLinear (``model.linear.kind: bitlinear``, archlab/nn/bitlinear.py): ``bitlinear`` offline, the
published checkpoints' ternary weights packed four to a uint8 with a ``weight_scale`` each (``weights:
offline``), or ``autobitlinear`` online, full-precision weights quantised at each forward (``weights: online``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from archlab.config import ModelConfig
from archlab.config.model import LinearConfig
from archlab.interop.families.base import Family, Rule
from archlab.interop.families.llama import GATED, MLPForm, _LlamaStyle
from archlab.interop.families.mlps import GATED_FROM_HF, GATED_TO_HF, mlp_section
from archlab.interop.families.tensors import TensorMap, Tensors
from archlab.interop.families.values import refuse_hf
from archlab.nn.bitlinear import pack, unpack

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


# quantization_config's (linear_class, quantization_mode) -> model.linear.weights
QUANTISED = {("bitlinear", "offline"): "offline", ("autobitlinear", "online"): "online"}
MODES = {"bitlinear": "offline", "autobitlinear": "online"}
QUANT_KEYS = {
    "quant_method",
    "linear_class",
    "quantization_mode",
    "use_rms_norm",
    "rms_norm_eps",
    "modules_to_not_convert",
}
PROJECTIONS = ("attn.qkv.weight", "attn.proj.weight", "mlp.gate_up.weight", "mlp.down.weight")


def linear_from_hf(c: Any) -> LinearConfig:
    """``model.linear`` of a BitNetConfig: dense without a quantization_config; else each of its fields that
    archlab cannot honour refused, naming it."""
    q = getattr(c, "quantization_config", None)
    if not q:
        return LinearConfig()
    q = q if isinstance(q, dict) else q.to_dict()
    for key in sorted(set(q) - QUANT_KEYS):
        refuse_hf(c, f"quantization_config.{key}", f"absent (BitNetQuantConfig's keys: {sorted(QUANT_KEYS)})", q[key])
    if q.get("quant_method") != "bitnet":
        refuse_hf(
            c, "quantization_config.quant_method", "bitnet (BitLinear; no other quantisation)", q.get("quant_method")
        )
    linear_class, mode = q.get("linear_class", "bitlinear"), q.get("quantization_mode", "offline")
    if linear_class not in MODES:
        refuse_hf(c, "quantization_config.linear_class", "bitlinear or autobitlinear", linear_class)
    if (linear_class, mode) not in QUANTISED:
        why = f"{MODES[linear_class]} with linear_class {linear_class} (archlab holds BitLinear offline, AutoBitLinear online)"
        refuse_hf(c, "quantization_config.quantization_mode", why, mode)
    if q.get("use_rms_norm"):
        refuse_hf(c, "quantization_config.use_rms_norm", "false (no RMSNorm inside each BitLinear)", True)
    skipped = q.get("modules_to_not_convert")
    if skipped is not None and sorted(skipped) != ["lm_head"]:
        refuse_hf(
            c, "quantization_config.modules_to_not_convert", "null or [lm_head] (the head alone stays dense)", skipped
        )
    return LinearConfig(kind="bitlinear", weights=QUANTISED[(linear_class, mode)])


def linear_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The quantization_config key of a BitLinear model (none for a dense one)."""
    if cfg.linear.kind != "bitlinear":
        return {}
    linear_class = {v: k for k, v in QUANTISED.items()}[cfg.linear.weights][0]
    config = dict(quant_method="bitnet", linear_class=linear_class, quantization_mode=cfg.linear.weights)
    return {"quantization_config": dict(config, use_rms_norm=False, rms_norm_eps=1e-6, modules_to_not_convert=None)}


def _follow_dtype(layer: Any, args: Any) -> None:
    """transformers' BitLinear unpacks to the dtype it was built in: the one its scale was moved to since."""
    layer.dtype = layer.weight_scale.dtype


def quantised_model(base: type) -> type:
    """What builds transformers' ``base`` model: an instance of ``base`` itself, whose every Linear but
    ``lm_head`` is, for a quantised config, transformers' BitLinear (offline) or AutoBitLinear (online), as
    ``from_pretrained`` builds it from a quantised checkpoint."""
    from transformers.integrations import bitnet

    class Quantised:
        def __new__(cls, config: Any) -> Any:
            model = base(config)
            q = getattr(config, "quantization_config", None)
            if not q:
                return model
            online = (q if isinstance(q, dict) else q.to_dict()).get("linear_class") == "autobitlinear"
            for name, module in list(model.named_modules()):
                if isinstance(module, nn.Linear) and name != "lm_head":
                    n_in, n_out, bias, w = (
                        module.in_features,
                        module.out_features,
                        module.bias is not None,
                        module.weight,
                    )
                    if online:
                        layer = bitnet.AutoBitLinear(n_in, n_out, bias, w.device, w.dtype, online_quant=True)
                    else:
                        layer = bitnet.BitLinear(n_in, n_out, bias, w.device, w.dtype)
                        layer.register_forward_pre_hook(_follow_dtype)
                    model.set_submodule(name, layer)
            return model

    return Quantised


class BitNet(_LlamaStyle):
    """BitNetForCausalLM: LLaMA's names, norms, RoPE and one ``attention_bias`` flag, an RMSNorm over the
    heads' output (``attn_sub_norm``, hidden_size wide: heads of d_model / n_head) and over the gated
    MLP's hidden activations (``ffn_sub_norm``), no MLP biases."""

    model_type, title, model_class, config_class = "bitnet", "BitNet b1.58", "BitNetForCausalLM", "BitNetConfig"
    parts = (
        "LLaMA's layers with RMSNorm sub-norms before o_proj and down_proj, a squared-ReLU gated MLP; "
        "quantised, BitLinear projections (packed ternary weights offline, AutoBitLinear online)"
    )
    features = frozenset(
        {"model.position.scaling.kind", "model.attention.sub_norm", "model.mlp.sub_norm", "model.linear.kind"}
    )
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
        return {**kwargs, **linear_to_hf(cfg)}

    def from_hf(self, c: Any) -> ModelConfig:
        linear = linear_from_hf(c)
        cfg = super().from_hf(c)
        cfg.attention.sub_norm, cfg.linear = True, linear
        return cfg

    def hf_class(self, transformers: Any) -> type:
        return quantised_model(super().hf_class(transformers))

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        """LLaMA's, and offline each projection's weight_scale (a fused one's, its parts' stacked)."""
        maps = super().tensors(cfg)
        if cfg.linear.kind != "bitlinear" or cfg.linear.weights != "offline":
            return maps
        scales = [
            TensorMap(
                m.archlab.removesuffix("weight") + "weight_scale",
                tuple(h.removesuffix("weight") + "weight_scale" for h in m.hf),
                "stacked" if len(m.hf) > 1 else "same",
                (1,) * len(m.hf),
            )
            for m in maps
            if m.archlab.endswith(PROJECTIONS)
        ]
        return maps + scales

    def hf_weights(self, c: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Packed projections (uint8) unpacked to their ternary values, in their weight_scale's dtype."""
        return {
            k: unpack(v, state[k + "_scale"].dtype) if v.dtype == torch.uint8 and k + "_scale" in state else v
            for k, v in state.items()
        }

    def to_hf_weights(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Offline, each projection's ternary weight packed four to a uint8, as transformers' BitLinear holds it."""
        if cfg.linear.kind != "bitlinear" or cfg.linear.weights != "offline":
            return state
        out = dict(state)
        for k in state:
            if k + "_scale" in state:
                w = state[k]
                if not bool(((w == -1) | (w == 0) | (w == 1)).all()):
                    raise ValueError(f"{k}: offline BitLinear weights must be ternary (-1, 0, 1) to pack")
                out[k] = pack(w)
        return out

    def attention_tensors(self, t: Tensors, archlab: str, hf: str) -> None:
        super().attention_tensors(t, archlab, hf)
        t.add(f"{archlab}.sub_norm", f"{hf}.attn_sub_norm")


RECORDS: tuple[Family, ...] = (BitNet(),)
