"""The Hugging Face model families archlab converts to and from, one record each.

A record (a ``Family`` subclass) holds everything about its family: the transformers classes, what
it requires of an archlab layout (``check``), the config mapping both ways (``to_hf`` / ``from_hf``),
and every tensor's name and layout (``tensors``). ``family_of`` picks the record for an archlab
layout; ``DENSE`` finds it by the Hugging Face ``model_type``. The mixture-of-experts families
(Mixtral, Qwen3-MoE, DeepSeek-V2/V3) live in ``archlab.interop.hf_sparse``; ``archlab.interop.hf`` joins
the two tables and runs the conversions. Nothing here imports transformers: records read configs by
attribute.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, NoReturn

import torch
from torch import Tensor

from archlab.config import (
    AttentionConfig,
    BlockConfig,
    HeadConfig,
    MLPConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
    n_kv_head,
)
from archlab.errors import ConfigError
from archlab.nn.attention import head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.rope import attention_factor, rotary_dim

Rule = tuple[str, tuple, str]  # (field "model.a.b", the values a family can hold, why)


class Problem(NamedTuple):
    """A field whose value a family cannot hold: what it needs instead (``wants``) and why."""

    field: str  # "model.a.b"
    value: Any
    wants: str  # "rmsnorm", "swiglu or geglu", "head_dim=64 (full rotary)"
    why: str = ""  # " (its experts are gated)": appended to the refusal


# Optional parts of a layout, at the value that means "absent". A family lists the ones it holds in
# ``Family.features``; every other one must stay at this value.
FEATURES: dict[str, tuple[Any, str]] = {
    "model.dropout": (0.0, "no embedding or residual dropout"),
    "model.scale_embedding": (False, "unscaled embeddings"),
    "model.embedding_norm": (False, "no norm on the token embeddings"),
    "model.embedding_multiplier": (1.0, "unscaled embeddings"),
    "model.block.residual_multiplier": (1.0, "sublayer outputs added to the residual stream unscaled"),
    "model.head.logit_scale": (1.0, "unscaled logits"),
    "model.norm.unit_offset": (False, "norm scales stored as w"),
    "model.attention.qk_norm": ("none", "no QK-norm"),
    "model.attention.qk_norm_after_rope": (False, "QK-norm before RoPE"),
    "model.attention.qk_norm_per_head_scale": (False, "one QK-norm scale shared by the heads"),
    "model.attention.clip_qkv": (None, "q, k and v unclipped"),
    "model.attention.scale": (None, "scores scaled by 1/sqrt(head_dim)"),
    "model.attention.softcap": (None, "no score soft-capping"),
    "model.attention.window": (None, "no sliding window"),
    "model.attention.chunk": (None, "no chunked attention"),
    "model.attention.sinks": (False, "no attention sinks"),
    "model.attention.gate": ("none", "no attention output gate"),
    "model.attention.query_scale_beta": (None, "queries not scaled by position"),
    "model.head.softcap": (None, "no logit soft-capping"),
    "model.position.scaling": ("none", "unscaled RoPE"),
    "model.position.truncate": (True, "YaRN's band rounded outward"),
    "model.position.short_factor": (None, "no LongRoPE factors"),
    "model.position.long_factor": (None, "no LongRoPE factors"),
    "model.position.alibi_scale": (1.0, "ALiBi's slopes as Press et al."),
    "model.position.alibi_rounding": ("none", "ALiBi's bias in float32"),
    "model.layers.first": ([], "every layer the same parts"),
    "model.layers.pattern": ([], "every layer the same parts"),
    "model.mlp.swiglu_limit": (None, "no SwiGLU clamp"),
    "model.mlp.shared_swiglu_limit": (None, "shared experts clamped as the routed ones"),
    "model.mlp.swiglu_alpha": (1.0, "a SiLU gate"),
    "model.mlp.up_offset": (0.0, "no offset on the up projection"),
    "model.mlp.router_bias": (False, "no router bias"),
    "model.mlp.weight_input": (False, "routing weights on the experts' outputs"),
}

# Plain MLPs compute act(fc(x)): transformers activation <-> archlab (kind, approximate).
PLAIN_FROM_HF = {
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "gelu": ("gelu", "none"),
    "relu": ("relu", "none"),
}
PLAIN_TO_HF = {("gelu", "tanh"): "gelu_new", ("gelu", "none"): "gelu", ("relu", "none"): "relu"}
# Gated MLPs compute down(act(gate(x)) * up(x)): hidden_act <-> archlab (kind, approximate).
GATED_FROM_HF = {
    "silu": ("swiglu", "none"),
    "gelu": ("geglu", "none"),
    "gelu_pytorch_tanh": ("geglu", "tanh"),
    "gelu_new": ("geglu", "tanh"),
}
GATED_TO_HF = {("swiglu", "none"): "silu", ("geglu", "none"): "gelu", ("geglu", "tanh"): "gelu_pytorch_tanh"}

# RoPE scalings archlab implements, and the rope_parameters keys each one reads (yarn: as transformers'
# _compute_yarn_parameters reads them; DeepSeek's families alone convert it, see hf_sparse).
_ROPE_KEYS = {
    "default": {"rope_type", "rope_theta", "partial_rotary_factor"},
    "linear": {"rope_type", "rope_theta", "partial_rotary_factor", "factor"},
    "llama3": {
        "rope_type",
        "rope_theta",
        "partial_rotary_factor",
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    },
    "yarn": {
        "rope_type",
        "rope_theta",
        "partial_rotary_factor",
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
        "attention_factor",
    },
}


def fmt(value: Any) -> str:
    """A value as it is written in YAML: true, false, null, 'text', 1.0."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    return repr(value)


def bare(value: Any) -> str:
    """A value as it is typed in a ``key=value`` override: text unquoted, else as ``fmt`` writes it."""
    return value if isinstance(value, str) else fmt(value)


def value_of(cfg: ModelConfig, field: str) -> Any:
    """The value of ``model.a.b`` in ``cfg``."""
    value = cfg
    for part in field.split(".")[1:]:
        value = getattr(value, part)
    return value


def kind_field(cfg: ModelConfig, kind: str | None, field: str) -> str:
    """``field`` (``model.attention.window``) as the field a refusal names: the kind's own
    (``model.layers.kinds.<kind>.attention.window``) where layer kind ``kind`` sets it, else ``field``."""
    if kind is None:
        return field
    value: Any = (cfg.layers.kinds or {}).get(kind, {})
    parts = field.split(".")[1:]
    for part in parts:
        if not isinstance(value, dict) or part not in value:
            return field
        value = value[part]
    return f"model.layers.kinds.{kind}.{'.'.join(parts)}"


def refuse_hf(c: Any, name: str, allowed: str, value: Any = None) -> NoReturn:
    """Refuse the HF config field ``name`` (dotted for a key of a dict field), naming its class."""
    if value is None and "." not in name:
        value = getattr(c, name, None)
    raise ConfigError(f"{type(c).__name__}.{name}", value, allowed)


# ---------------------------------------------------------------- tensors


class TensorMap(NamedTuple):
    """One archlab tensor and the HF tensor(s) it holds, in one of four layouts: ``same``;
    ``transposed`` (GPT-2's Conv1D stores (in, out)); ``stacked`` (archlab's fused q/k/v or gate/up is
    the HF tensors of ``sizes`` rows stacked along dim 0); ``heads_interleaved`` (GPT-NeoX's fused
    q/k/v holds [q_h, k_h, v_h] per head h; archlab holds every q, then every k, then every v;
    ``sizes`` = (n_head, head_dim)); ``experts_transposed`` (stacked experts stored [E, in, out], as
    gpt-oss's and Llama 4's, against archlab's [E, out, in]); ``gate_up_interleaved`` (gpt-oss's
    gate_up_proj [E, d, 2f] with the gate at even and up at odd columns, and its bias [E, 2f] likewise;
    archlab holds [E, 2f, d] and [E, 2f], the gate rows, then the up rows)."""

    archlab: str
    hf: tuple[str, ...]
    layout: str = "same"
    sizes: tuple[int, ...] = ()


def join(m: TensorMap, parts: list[Tensor], copy: bool) -> Tensor:
    """The archlab tensor of ``m`` from its HF tensors (a copy when ``copy``; fused ones always are)."""
    if m.layout == "stacked":
        return torch.cat(parts)
    if m.layout == "transposed":
        return parts[0].t().contiguous()
    if m.layout == "heads_interleaved":
        H, hd = m.sizes
        return parts[0].unflatten(0, (H, 3, hd)).transpose(0, 1).flatten(0, 2).contiguous()
    if m.layout == "experts_transposed":
        return parts[0].transpose(1, 2).contiguous()
    if m.layout == "gate_up_interleaved":
        rows = parts[0].transpose(1, 2) if parts[0].dim() == 3 else parts[0]
        return torch.cat((rows[:, 0::2], rows[:, 1::2]), dim=1).contiguous()
    return parts[0].detach().clone() if copy else parts[0]


def split(m: TensorMap, tensor: Tensor) -> list[Tensor]:
    """The HF tensors of ``m`` from the archlab one (the inverse of ``join``)."""
    if m.layout == "stacked":
        return [part.clone() for part in tensor.split(m.sizes)]
    if m.layout == "transposed":
        return [tensor.t().contiguous()]
    if m.layout == "heads_interleaved":
        H, hd = m.sizes
        return [tensor.unflatten(0, (3, H, hd)).transpose(0, 1).flatten(0, 2).contiguous()]
    if m.layout == "experts_transposed":
        return [tensor.transpose(1, 2).contiguous()]
    if m.layout == "gate_up_interleaved":
        f = tensor.shape[1] // 2
        rows = torch.stack((tensor[:, :f], tensor[:, f:]), dim=2).flatten(1, 2)
        return [(rows.transpose(1, 2) if rows.dim() == 3 else rows).contiguous()]
    return [tensor]


class Tensors:
    """Collects a family's TensorMaps: a module's weight and, when it has one, its bias."""

    def __init__(self, cfg: ModelConfig):
        self.cfg, self.maps = cfg, []

    def add(self, archlab: str, hf: str, bias: bool = False, layout: str = "same", sizes: tuple = ()) -> None:
        self.maps.append(TensorMap(f"{archlab}.weight", (f"{hf}.weight",), layout, sizes))
        if bias:
            self.maps.append(
                TensorMap(f"{archlab}.bias", (f"{hf}.bias",), "same" if layout == "transposed" else layout, sizes)
            )

    def stacked(self, archlab: str, hf: list[str], bias: bool, sizes: tuple[int, ...]) -> None:
        """archlab's fused Linear = the HF Linears ``hf`` stacked along their output rows."""
        self.maps.append(TensorMap(f"{archlab}.weight", tuple(f"{n}.weight" for n in hf), "stacked", sizes))
        if bias:
            self.maps.append(TensorMap(f"{archlab}.bias", tuple(f"{n}.bias" for n in hf), "stacked", sizes))

    def qkv(self, archlab: str, hf_attn: str, bias: bool) -> None:
        """Separate q_proj, k_proj, v_proj."""
        cfg = self.cfg
        sizes = tuple(n * head_dim(cfg) for n in (cfg.attention.n_head, n_kv_head(cfg), n_kv_head(cfg)))
        self.stacked(archlab, [f"{hf_attn}.{x}_proj" for x in "qkv"], bias, sizes)

    def gate_up(self, archlab: str, hf_mlp: str, bias: bool) -> None:
        """archlab's [gate | up] = gate_proj, up_proj."""
        self.stacked(archlab, [f"{hf_mlp}.gate_proj", f"{hf_mlp}.up_proj"], bias, (d_ff(self.cfg), d_ff(self.cfg)))

    def head(self) -> list[TensorMap]:
        """The untied head's weight and the head's bias, then every map collected."""
        if not self.cfg.head.tied:
            self.maps.append(TensorMap("head.weight", ("lm_head.weight",)))
        if self.cfg.head.bias:
            self.maps.append(TensorMap("head.bias", ("lm_head.bias",)))
        return self.maps


# ---------------------------------------------------------------- RoPE both ways


def rope_fraction(cfg: ModelConfig) -> float:
    """partial_rotary_factor for cfg's rotary dims r of a head of hd: transformers rotates int(hd · factor)
    dims, and hd · (r / hd) can fall just below r in floating point; the next float up then reaches it."""
    hd, r, p = head_dim(cfg), rotary_dim(cfg), cfg.position
    fraction = p.rotary_fraction if p.rotary_fraction is not None else r / hd
    while int(hd * fraction) < r:
        fraction = math.nextafter(fraction, 1.0)
    return fraction


def rope_to_hf(cfg: ModelConfig, fraction: float | None = None) -> dict[str, Any]:
    """transformers' rope_parameters for cfg's RoPE (with partial_rotary_factor when ``fraction``)."""
    p = cfg.position
    params: dict[str, Any] = {"rope_type": "default" if p.scaling == "none" else p.scaling, "rope_theta": p.theta}
    if p.scaling != "none":
        params["factor"] = p.factor
    if p.scaling == "llama3":
        params.update(
            low_freq_factor=p.low_freq_factor,
            high_freq_factor=p.high_freq_factor,
            original_max_position_embeddings=p.original_context,
        )
    if p.scaling == "yarn":
        params.update(original_max_position_embeddings=p.original_context, beta_fast=p.beta_fast, beta_slow=p.beta_slow)
        if not p.truncate:  # transformers' default is true: written only when false (gpt-oss's published configs)
            params["truncate"] = False
        if p.mscale is not None:  # with mscale_all_dim (archlab's validation asks for both or neither)
            params.update(mscale=p.mscale, mscale_all_dim=p.mscale_all_dim)
    if fraction is not None:
        params["partial_rotary_factor"] = fraction
    return params


def rope_from_hf(
    c: Any, hd: int, partial: bool, scalings: tuple[str, ...] = ("default", "linear", "llama3")
) -> PositionConfig:
    """archlab's RoPE from transformers' rope_parameters (``partial``: the family rotates part of a head;
    ``scalings``: the rope_types this family converts)."""
    rope = dict(getattr(c, "rope_parameters", None) or {})
    if any(isinstance(v, dict) for v in rope.values()):
        refuse_hf(c, "rope_parameters", "one set of RoPE parameters for every layer", rope)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in scalings:
        names = ", ".join(repr(s) for s in scalings)
        refuse_hf(
            c, "rope_parameters.rope_type", f"one of {names} (the scalings archlab converts for this family)", rope_type
        )
    for key in sorted(set(rope) - _ROPE_KEYS[rope_type] - {"type"}):
        refuse_hf(
            c, f"rope_parameters.{key}", f"absent for rope_type={rope_type!r} (archlab has no such setting)", rope[key]
        )
    fraction = rope.get("partial_rotary_factor", 1.0)
    dims = int(hd * fraction)
    position = PositionConfig(kind="rope", theta=float(rope.get("rope_theta", 10000.0)), pairing="half")
    if fraction != 1.0:
        if not partial:
            refuse_hf(c, "rope_parameters.partial_rotary_factor", "1.0 (this family rotates whole heads)", fraction)
        if dims <= 0 or dims % 2:
            refuse_hf(
                c,
                "rope_parameters.partial_rotary_factor",
                f"a fraction of head_dim={hd} that rotates an even number of dims",
                fraction,
            )
        if abs(hd * fraction - dims) <= 1e-6:
            position.rotary_fraction = fraction
        else:
            position.rotary_dim = dims
    if rope_type in ("linear", "llama3"):
        position.scaling, position.factor = rope_type, float(rope["factor"])
    if rope_type == "llama3":
        position.low_freq_factor = float(rope["low_freq_factor"])
        position.high_freq_factor = float(rope["high_freq_factor"])
        position.original_context = int(rope["original_max_position_embeddings"])
    if rope_type == "yarn":
        _yarn_from_hf(c, rope, position)
    return position


def _yarn_from_hf(c: Any, rope: dict[str, Any], position: PositionConfig) -> None:
    """YaRN's fields as transformers reads them: a missing factor is max_position_embeddings over the
    original context, a missing (or zero) beta_fast / beta_slow is 32 / 1, and mscale counts only with
    mscale_all_dim (a zero one is absent), a missing truncate is true (the band's ends rounded outward).
    archlab derives the attention factor from factor and the two mscales."""
    original = int(rope["original_max_position_embeddings"])
    factor = rope.get("factor")
    position.scaling, position.original_context = "yarn", original
    position.factor = float(factor if factor is not None else c.max_position_embeddings / original)
    position.beta_fast, position.beta_slow = float(rope.get("beta_fast") or 32.0), float(rope.get("beta_slow") or 1.0)
    mscale, all_dim = rope.get("mscale") or None, rope.get("mscale_all_dim") or None
    if (mscale is None) != (all_dim is None):
        name = "mscale" if all_dim is None else "mscale_all_dim"
        refuse_hf(
            c,
            f"rope_parameters.{name}",
            "mscale and mscale_all_dim both set, or both absent (transformers ignores mscale alone, and applies "
            "mscale_all_dim alone to the softmax only)",
            rope[name],
        )
    position.mscale = None if mscale is None else float(mscale)
    position.mscale_all_dim = None if all_dim is None else float(all_dim)
    truncate = rope.get("truncate", True)
    if not isinstance(truncate, bool):
        refuse_hf(c, "rope_parameters.truncate", "true or false", truncate)
    position.truncate = truncate
    given = rope.get("attention_factor")
    if given is not None and not math.isclose(given, attention_factor(position), rel_tol=1e-12):
        refuse_hf(
            c,
            "rope_parameters.attention_factor",
            f"absent or {attention_factor(position)} (archlab derives it from factor, mscale and mscale_all_dim)",
            given,
        )


# ---------------------------------------------------------------- sliding windows both ways


def layer_types(layers: list[ModelConfig]) -> list[str]:
    """transformers' layer_types of each layer's config (``config.layers.layer_configs``): sliding where the
    layer has a window."""
    return ["full_attention" if lc.attention.window is None else "sliding_attention" for lc in layers]


def sliding_window(cfg: ModelConfig, layers: list[ModelConfig]) -> int:
    """transformers' one sliding_window: the sliding layers' (the families refuse two); where no layer
    slides, the context (transformers builds the sliding mask in some families whether or not a layer uses it)."""
    return next((lc.attention.window for lc in layers if lc.attention.window is not None), cfg.context_length)


def sliding_to_hf(cfg: ModelConfig, layers: list[ModelConfig]) -> dict[str, Any]:
    """transformers' ``sliding_window`` and ``layer_types`` of each layer's config."""
    return {"sliding_window": sliding_window(cfg, layers), "layer_types": layer_types(layers)}


SLIDING, FULL = "sliding_attention", "full_attention"  # transformers' layer_types


def checked_types(c: Any, other: str = SLIDING) -> list[str]:
    """transformers' layer_types (every layer full where absent), each 'full_attention' or ``other``
    (Llama 4: 'chunked_attention'); sliding layers need a ``sliding_window``."""
    n: int = c.num_hidden_layers
    types = list(getattr(c, "layer_types", None) or [FULL] * n)
    if len(types) != n or set(types) - {FULL, other}:
        refuse_hf(c, "layer_types", f"{n} entries, each {FULL!r} or {other!r}", types)
    if other == SLIDING and SLIDING in types and getattr(c, "sliding_window", None) is None:
        refuse_hf(c, "sliding_window", f"the window of the {SLIDING} layers")
    return types


def uniform_window(c: Any) -> int | None:
    """The window of a config whose layers all slide or none does (``layer_types``; the layered records of
    ``hf_layered`` read the others): ``sliding_window``, or None."""
    types = checked_types(c)
    if SLIDING not in types:
        return None
    if FULL in types:
        refuse_hf(c, "layer_types", "every layer alike (a layered record reads the others)", types)
    return c.sliding_window


# ---------------------------------------------------------------- the records


class Family:
    """One Hugging Face family. Subclasses set the class attributes and implement the four methods."""

    model_type: str  # transformers' config.model_type
    title: str  # the family's name in messages
    model_class: str
    config_class: str
    prefix: str  # the base model's tensor prefix, absent from checkpoints saved from the base model alone
    features: frozenset[str] = frozenset()  # the FEATURES this family holds
    attention_kind = "causal"  # the model.attention.kind its layers have
    position_kind = "rope"  # the model.position.kind it holds
    position_why = ""  # why, in its refusal
    scalings: tuple[str, ...] = ("none", "linear", "llama3")  # RoPE scalings, if it holds model.position.scaling
    renames: dict[str, str] = {}  # older checkpoints' tensor-name prefixes -> today's

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        """What the family requires of the layout beyond the absent FEATURES."""
        return []

    def problems(self, cfg: ModelConfig) -> list[Problem]:
        """Every field (``model.a.b``) whose value this family cannot hold exactly, in the order ``check``
        meets them: ``archlab-check`` lists them all at once."""
        absent = [(f, (default,), f" ({why})") for f, (default, why) in FEATURES.items() if f not in self.features]
        rules: list[Rule] = [
            ("model.attention.kind", (self.attention_kind,), ""),
            ("model.position.kind", (self.position_kind,), self.position_why),
            ("model.head.kind", ("linear",), ""),
        ]
        if "model.position.scaling" in self.features:
            rules.append(("model.position.scaling", self.scalings, ""))
        found = []
        for field, allowed, why in rules + self.rules(cfg) + absent:
            value = value_of(cfg, field)
            if value not in allowed:
                found.append(Problem(field, value, " or ".join(bare(a) for a in allowed), why))
        return found

    def refusal(self, problem: Problem) -> ConfigError:
        """The ConfigError of one problem, naming this family."""
        return ConfigError(
            problem.field, problem.value, f"{problem.wants} to convert to Hugging Face {self.title}{problem.why}"
        )

    def check(self, cfg: ModelConfig) -> None:
        """Refuse the first field (``model.a.b``) whose value this family cannot hold exactly."""
        problems = self.problems(cfg)
        if problems:
            raise self.refusal(problems[0])

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        """The transformers config's keyword arguments (``cfg`` passed ``check``)."""
        raise NotImplementedError

    def from_hf(self, c: Any) -> ModelConfig:
        """archlab's config of a transformers config of this family (refusing what it cannot hold)."""
        raise NotImplementedError

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        """Every archlab tensor with its HF name(s) and layout."""
        raise NotImplementedError

    def hf_class(self, transformers: Any) -> type:
        """The transformers class ``to_hf`` builds and ``from_hf`` takes (``model_class``)."""
        return getattr(transformers, self.model_class)

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """A checkpoint's tensors (prefixed and renamed) as the transformers model holds them in memory: the
        same for the dense families; the MoE ones save each expert apart and stack them when loading."""
        return state

    def mha_rules(self, cfg: ModelConfig) -> list[Rule]:
        H, d = cfg.attention.n_head, cfg.d_model
        return [
            ("model.attention.n_kv_head", (None, H), f" ({self.title} has one key/value head per query head)"),
            ("model.attention.head_dim", (None, d // H), f" ({self.title} uses d_model / n_head)"),
        ]

    @staticmethod
    def full_rotary(cfg: ModelConfig) -> list[Problem]:
        """The problem of a family that rotates whole heads, when ``cfg`` rotates part of one."""
        if rotary_dim(cfg) == head_dim(cfg):
            return []
        return [Problem("model.position.rotary_dim", rotary_dim(cfg), f"head_dim={head_dim(cfg)} (full rotary)")]


def _one_dropout(c: Any, embedding: str, residual: str) -> float:
    if getattr(c, embedding) != getattr(c, residual):
        refuse_hf(c, embedding, f"equal to {residual}={getattr(c, residual)} (archlab has one model.dropout)")
    return float(getattr(c, residual))


def _plain_mlp(c: Any, act: str, width: int) -> MLPConfig:
    """act(fc(x)) with biases, its activation read from the config key ``act``."""
    name = getattr(c, act)
    if name not in PLAIN_FROM_HF:
        refuse_hf(c, act, f"one of {sorted(PLAIN_FROM_HF)}")
    kind, approximate = PLAIN_FROM_HF[name]
    return MLPConfig(kind=kind, d_ff=width, bias=True, approximate=approximate)


def _gated_mlp(c: Any, act: str) -> MLPConfig:
    """down(act(gate(x)) * up(x)) without biases, its activation read from the config key ``act``."""
    name = getattr(c, act)
    if name not in GATED_FROM_HF:
        refuse_hf(c, act, f"one of {sorted(GATED_FROM_HF)}")
    kind, approximate = GATED_FROM_HF[name]
    return MLPConfig(kind=kind, d_ff=c.intermediate_size, bias=False, approximate=approximate)


def _plain_activation(cfg: ModelConfig) -> str:
    return PLAIN_TO_HF[(cfg.mlp.kind, cfg.mlp.approximate)]


# ---- GPT-2 and GPT-J


class _GPT(Family):
    """GPT-2 and GPT-J share LayerNorm with a bias, a two-matrix MLP with biases and their config names."""

    prefix = "transformer."
    features = frozenset({"model.dropout"})

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.mlp.kind", ("gelu", "relu"), ""),
            ("model.mlp.bias", (True,), ""),
            *self.mha_rules(cfg),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            vocab_size=cfg.vocab_size,
            n_positions=cfg.context_length,
            n_embd=cfg.d_model,
            n_layer=cfg.n_layer,
            n_head=cfg.attention.n_head,
            n_inner=d_ff(cfg),
            activation_function=_plain_activation(cfg),
            resid_pdrop=cfg.dropout,
            embd_pdrop=cfg.dropout,
            attn_pdrop=cfg.attention.dropout,
            layer_norm_epsilon=cfg.norm.eps,
            initializer_range=cfg.init_std,
            tie_word_embeddings=cfg.head.tied,
        )

    def base_config(self, c: Any) -> ModelConfig:
        return ModelConfig(
            vocab_size=c.vocab_size,
            context_length=c.n_positions,
            n_layer=c.n_layer,
            d_model=c.n_embd,
            dropout=_one_dropout(c, "embd_pdrop", "resid_pdrop"),
            init_std=c.initializer_range,
            norm=NormConfig(kind="layernorm", eps=c.layer_norm_epsilon, bias=True),
            attention=AttentionConfig(n_head=c.n_head, dropout=c.attn_pdrop),
            mlp=_plain_mlp(c, "activation_function", c.n_inner or 4 * c.n_embd),
        )


class GPT2(_GPT):
    """GPT2LMHeadModel: pre-norm, learned positions, Conv1D layers (biases everywhere), no head bias."""

    model_type, title, model_class, config_class = "gpt2", "GPT-2", "GPT2LMHeadModel", "GPT2Config"
    position_kind = "learned"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            ("model.block.kind", ("pre",), ""),
            ("model.attention.qkv_bias", (True,), " (Conv1D layers always have a bias)"),
            ("model.attention.out_bias", (True,), " (Conv1D layers always have a bias)"),
            ("model.head.bias", (False,), ""),
        ]

    def from_hf(self, c: Any) -> ModelConfig:
        for name, want in (
            ("add_cross_attention", False),
            ("scale_attn_weights", True),
            ("scale_attn_by_inverse_layer_idx", False),
        ):
            if getattr(c, name, want) != want:
                refuse_hf(
                    c, name, f"{fmt(want)} (archlab attention is causal self-attention scaled by 1/sqrt(head_dim))"
                )
        cfg = self.base_config(c)
        cfg.block, cfg.position = BlockConfig(kind="pre"), PositionConfig(kind="learned")
        cfg.head = HeadConfig(tied=c.tie_word_embeddings, bias=False)
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "transformer.wte")
        t.add("position.table", "transformer.wpe")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"transformer.h.{i}"
            t.add(f"{b}.attn_norm", f"{h}.ln_1", True)
            t.add(f"{b}.attn.qkv", f"{h}.attn.c_attn", True, "transposed")  # [Q | K | V] in both
            t.add(f"{b}.attn.proj", f"{h}.attn.c_proj", True, "transposed")
            t.add(f"{b}.mlp_norm", f"{h}.ln_2", True)
            t.add(f"{b}.mlp.fc", f"{h}.mlp.c_fc", True, "transposed")
            t.add(f"{b}.mlp.proj", f"{h}.mlp.c_proj", True, "transposed")
        t.add("final_norm", "transformer.ln_f", True)
        return t.head()


class GPTJ(_GPT):
    """GPTJForCausalLM: parallel block with one shared LayerNorm, interleaved RoPE (base 1e4), no
    attention biases, a head bias."""

    model_type, title, model_class, config_class = "gptj", "GPT-J", "GPTJForCausalLM", "GPTJConfig"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            ("model.block.kind", ("parallel",), ""),
            ("model.block.shared_norm", (True,), " (one ln_1 feeds attention and MLP)"),
            ("model.position.pairing", ("interleaved",), ""),
            ("model.position.theta", (10000.0,), " (GPT-J's rotary base is fixed)"),
            ("model.attention.qkv_bias", (False,), ""),
            ("model.attention.out_bias", (False,), ""),
            ("model.head.bias", (True,), ""),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), rotary_dim=rotary_dim(cfg))

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = self.base_config(c)
        cfg.block = BlockConfig(kind="parallel", shared_norm=True)
        cfg.position = PositionConfig(kind="rope", theta=10000.0, rotary_dim=c.rotary_dim, pairing="interleaved")
        cfg.attention.qkv_bias = cfg.attention.out_bias = False
        cfg.head = HeadConfig(tied=c.tie_word_embeddings, bias=True)
        return cfg

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "transformer.wte")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"transformer.h.{i}"
            t.add(f"{b}.attn_norm", f"{h}.ln_1", True)
            t.qkv(f"{b}.attn.qkv", f"{h}.attn", False)
            t.add(f"{b}.attn.proj", f"{h}.attn.out_proj")
            t.add(f"{b}.mlp.fc", f"{h}.mlp.fc_in", True)
            t.add(f"{b}.mlp.proj", f"{h}.mlp.fc_out", True)
        t.add("final_norm", "transformer.ln_f", True)
        return t.head()


# ---- GPT-NeoX and Phi: LayerNorm, plain MLP, partial half-paired RoPE


class GPTNeoX(Family):
    """GPTNeoXForCausalLM (Pythia): two LayerNorms per block, in parallel (``use_parallel_residual``)
    or in series (pre-norm); one fused q/k/v Linear laid out per head; partial half-paired RoPE; one
    ``attention_bias`` for q/k/v and output; MLP biases; no head bias."""

    model_type, title, model_class, config_class = "gpt_neox", "GPT-NeoX", "GPTNeoXForCausalLM", "GPTNeoXConfig"
    prefix = "gpt_neox."
    features = frozenset({"model.dropout", "model.position.scaling"})
    renames = {"embed_out.": "lm_head."}  # checkpoints written before transformers 5

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        rules = [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.block.kind", ("parallel", "pre"), ""),
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.kind", ("gelu", "relu"), ""),
            ("model.mlp.bias", (True,), ""),
            *self.mha_rules(cfg),
            ("model.attention.out_bias", (cfg.attention.qkv_bias,), " (one attention_bias flag sets both)"),
            ("model.head.bias", (False,), ""),
        ]
        if cfg.block.kind == "parallel":
            rules.append(("model.block.shared_norm", (False,), " (two LayerNorms per block)"))
        return rules

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.d_model,
            num_hidden_layers=cfg.n_layer,
            num_attention_heads=cfg.attention.n_head,
            intermediate_size=d_ff(cfg),
            hidden_act=_plain_activation(cfg),
            attention_dropout=cfg.attention.dropout,
            hidden_dropout=cfg.dropout,
            max_position_embeddings=cfg.context_length,
            initializer_range=cfg.init_std,
            layer_norm_eps=cfg.norm.eps,
            tie_word_embeddings=cfg.head.tied,
            use_parallel_residual=cfg.block.kind == "parallel",
            rope_parameters=rope_to_hf(cfg, rope_fraction(cfg)),
            attention_bias=cfg.attention.qkv_bias,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        hd = c.hidden_size // c.num_attention_heads
        return ModelConfig(
            vocab_size=c.vocab_size,
            context_length=c.max_position_embeddings,
            n_layer=c.num_hidden_layers,
            d_model=c.hidden_size,
            dropout=float(c.hidden_dropout),
            init_std=c.initializer_range,
            norm=NormConfig(kind="layernorm", eps=c.layer_norm_eps, bias=True),
            block=BlockConfig(kind="parallel", shared_norm=False) if c.use_parallel_residual else BlockConfig(),
            position=rope_from_hf(c, hd, partial=True),
            attention=AttentionConfig(
                n_head=c.num_attention_heads,
                qkv_bias=c.attention_bias,
                out_bias=c.attention_bias,
                dropout=float(c.attention_dropout),
            ),
            mlp=_plain_mlp(c, "hidden_act", c.intermediate_size),
            head=HeadConfig(tied=c.tie_word_embeddings, bias=False),
        )

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, bias = Tensors(cfg), cfg.attention.qkv_bias
        t.add("tok_emb", "gpt_neox.embed_in")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"gpt_neox.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm", True)
            t.add(f"{b}.mlp_norm", f"{h}.post_attention_layernorm", True)
            t.add(
                f"{b}.attn.qkv",
                f"{h}.attention.query_key_value",
                bias,
                "heads_interleaved",
                (cfg.attention.n_head, head_dim(cfg)),
            )
            t.add(f"{b}.attn.proj", f"{h}.attention.dense", bias)
            t.add(f"{b}.mlp.fc", f"{h}.mlp.dense_h_to_4h", True)
            t.add(f"{b}.mlp.proj", f"{h}.mlp.dense_4h_to_h", True)
        t.add("final_norm", "gpt_neox.final_layer_norm", True)
        return t.head()


class Phi(Family):
    """PhiForCausalLM (phi-1.5, phi-2): parallel block with one shared LayerNorm, separate q/k/v and
    output Linears with biases, optional per-head LayerNorm of q and k, partial half-paired RoPE,
    MLP biases and a head bias."""

    model_type, title, model_class, config_class = "phi", "Phi", "PhiForCausalLM", "PhiConfig"
    prefix = "model."
    features = frozenset({"model.dropout", "model.position.scaling", "model.attention.qk_norm"})

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        rules = [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (True,), ""),
            ("model.block.kind", ("parallel",), ""),
            ("model.block.shared_norm", (True,), " (one input_layernorm feeds attention and MLP)"),
            ("model.position.pairing", ("half",), ""),
            ("model.attention.qkv_bias", (True,), ""),
            ("model.attention.out_bias", (True,), ""),
            ("model.attention.qk_norm", ("none", "head"), " (qk_layernorm is per head)"),
            ("model.mlp.kind", ("gelu", "relu"), ""),
            ("model.mlp.bias", (True,), ""),
            ("model.head.bias", (True,), ""),
        ]
        if cfg.attention.qk_norm == "head":
            H, d = cfg.attention.n_head, cfg.d_model
            rules.append(("model.attention.head_dim", (None, d // H), " (qk_layernorm spans d_model / n_head)"))
        return rules

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.d_model,
            intermediate_size=d_ff(cfg),
            num_hidden_layers=cfg.n_layer,
            num_attention_heads=cfg.attention.n_head,
            num_key_value_heads=n_kv_head(cfg),
            head_dim=head_dim(cfg),
            resid_pdrop=cfg.dropout,
            embd_pdrop=cfg.dropout,
            attention_dropout=cfg.attention.dropout,
            hidden_act=_plain_activation(cfg),
            max_position_embeddings=cfg.context_length,
            initializer_range=cfg.init_std,
            layer_norm_eps=cfg.norm.eps,
            tie_word_embeddings=cfg.head.tied,
            rope_parameters=rope_to_hf(cfg, rope_fraction(cfg)),
            qk_layernorm=cfg.attention.qk_norm == "head",
        )

    def from_hf(self, c: Any) -> ModelConfig:
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return ModelConfig(
            vocab_size=c.vocab_size,
            context_length=c.max_position_embeddings,
            n_layer=c.num_hidden_layers,
            d_model=c.hidden_size,
            dropout=_one_dropout(c, "embd_pdrop", "resid_pdrop"),
            init_std=c.initializer_range,
            norm=NormConfig(kind="layernorm", eps=c.layer_norm_eps, bias=True),
            block=BlockConfig(kind="parallel", shared_norm=True),
            position=rope_from_hf(c, hd, partial=True),
            attention=AttentionConfig(
                n_head=c.num_attention_heads,
                n_kv_head=c.num_key_value_heads,
                head_dim=hd,
                qkv_bias=True,
                out_bias=True,
                dropout=float(c.attention_dropout),
                qk_norm="head" if c.qk_layernorm else "none",
            ),
            mlp=_plain_mlp(c, "hidden_act", c.intermediate_size),
            head=HeadConfig(tied=c.tie_word_embeddings, bias=True),
        )

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t = Tensors(cfg)
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm", True)
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", True)
            if cfg.attention.qk_norm == "head":
                t.add(f"{b}.attn.q_norm", f"{h}.self_attn.q_layernorm", True)
                t.add(f"{b}.attn.k_norm", f"{h}.self_attn.k_layernorm", True)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.dense", True)
            t.add(f"{b}.mlp.fc", f"{h}.mlp.fc1", True)
            t.add(f"{b}.mlp.proj", f"{h}.mlp.fc2", True)
        t.add("final_norm", "model.final_layernorm", True)
        return t.head()


# ---- the LLaMA layout and its relatives: RMSNorm, gated MLP, full half-paired RoPE, separate q/k/v


class _LlamaStyle(Family):
    """What LLaMA, Mistral, Qwen2, Qwen3, Gemma, Gemma 2 and OLMo 2 share: the names
    (``model.layers.i.self_attn.q_proj`` ...), RMSNorm, a gated MLP, full half-paired RoPE, no head bias,
    no embedding or residual dropout. Each sets its block's norms (archlab name -> HF name), the
    activation's config key, and its own biases, windows, norms and scales."""

    prefix = "model."
    block = "pre"
    norms = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
    activation = "hidden_act"  # the config key of the MLP's activation

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.norm.kind", ("rmsnorm",), ""),
            ("model.block.kind", (self.block,), ""),
            ("model.position.pairing", ("half",), ""),
            ("model.mlp.kind", ("swiglu", "geglu"), ""),
            ("model.head.bias", (False,), ""),
            *self.bias_rules(cfg),
        ]

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        """Most families have one attention_bias flag for q/k/v and output, and no MLP biases."""
        return [
            ("model.attention.out_bias", (cfg.attention.qkv_bias,), " (one attention_bias flag sets q/k/v and output)"),
            ("model.mlp.bias", (False,), ""),
        ]

    def problems(self, cfg: ModelConfig) -> list[Problem]:
        return super().problems(cfg) + self.full_rotary(cfg)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        a = cfg.attention
        return {
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model,
            "intermediate_size": d_ff(cfg),
            "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": a.n_head,
            "num_key_value_heads": n_kv_head(cfg),
            "head_dim": head_dim(cfg),
            self.activation: GATED_TO_HF[(cfg.mlp.kind, cfg.mlp.approximate)],
            "max_position_embeddings": cfg.context_length,
            "initializer_range": cfg.init_std,
            "rms_norm_eps": cfg.norm.eps,
            "tie_word_embeddings": cfg.head.tied,
            "rope_parameters": rope_to_hf(cfg),
            "attention_dropout": a.dropout,
            "attention_bias": a.qkv_bias,
        }

    def from_hf(self, c: Any) -> ModelConfig:
        if getattr(c, "use_bidirectional_attention", None):
            refuse_hf(c, "use_bidirectional_attention", "false (archlab attention is causal)")
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        bias = bool(getattr(c, "attention_bias", False))
        return ModelConfig(
            vocab_size=c.vocab_size,
            context_length=c.max_position_embeddings,
            n_layer=c.num_hidden_layers,
            d_model=c.hidden_size,
            dropout=0.0,
            init_std=c.initializer_range,
            norm=NormConfig(kind="rmsnorm", eps=c.rms_norm_eps),
            block=BlockConfig(kind=self.block),
            position=rope_from_hf(c, hd, partial=False),
            attention=AttentionConfig(
                n_head=c.num_attention_heads,
                n_kv_head=c.num_key_value_heads or c.num_attention_heads,
                head_dim=hd,
                qkv_bias=bias,
                out_bias=bias,
                dropout=float(c.attention_dropout),
            ),
            mlp=_gated_mlp(c, self.activation),
            head=HeadConfig(tied=c.tie_word_embeddings, bias=False),
        )

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, a = Tensors(cfg), cfg.attention
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            for archlab, hf in self.norms.items():
                t.add(f"{b}.{archlab}", f"{h}.{hf}")
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", a.qkv_bias)
            if a.qk_norm != "none":
                t.add(f"{b}.attn.q_norm", f"{h}.self_attn.q_norm")
                t.add(f"{b}.attn.k_norm", f"{h}.self_attn.k_norm")
            t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj", a.out_bias)
            t.gate_up(f"{b}.mlp.gate_up", f"{h}.mlp", cfg.mlp.bias)
            t.add(f"{b}.mlp.down", f"{h}.mlp.down_proj", cfg.mlp.bias)
        t.add("final_norm", "model.norm")
        return t.head()


class Llama(_LlamaStyle):
    """LlamaForCausalLM: pre-norm, q/k/v and output biases together (``attention_bias``), MLP biases
    (``mlp_bias``), RoPE scaling (linear, llama3: Llama 3.1)."""

    model_type, title, model_class, config_class = "llama", "LLaMA", "LlamaForCausalLM", "LlamaConfig"
    features = frozenset({"model.position.scaling"})

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:  # any model.mlp.bias: mlp_bias
        return [
            ("model.attention.out_bias", (cfg.attention.qkv_bias,), " (one attention_bias flag sets q/k/v and output)")
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(super().to_hf(cfg), mlp_bias=cfg.mlp.bias)

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.mlp.bias = bool(getattr(c, "mlp_bias", False))
        return cfg


class Mistral(_LlamaStyle):
    """MistralForCausalLM: LLaMA's layers, no biases, a sliding window on every layer."""

    model_type, title, model_class, config_class = "mistral", "Mistral", "MistralForCausalLM", "MistralConfig"
    features = frozenset({"model.position.scaling", "model.attention.window"})

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.attention.qkv_bias", (False,), ""),
            ("model.attention.out_bias", (False,), ""),
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

    model_type, title, model_class, config_class = "qwen2", "Qwen2", "Qwen2ForCausalLM", "Qwen2Config"

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.attention.qkv_bias", (True,), " (q/k/v always have biases)"),
            ("model.attention.out_bias", (False,), " (o_proj has no bias)"),
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

    def problems(self, cfg: ModelConfig) -> list[Problem]:
        scale = cfg.attention.scale
        if self._query_scalar(cfg) is None:
            return [*super().problems(cfg), Problem("model.attention.scale", scale, self.SCALE_WANTS)]
        return super().problems(cfg)

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


DENSE: dict[str, Family] = {
    f.model_type: f
    for f in (GPT2(), GPTJ(), GPTNeoX(), Phi(), Llama(), Mistral(), Qwen2(), Qwen3(), Gemma(), Gemma2(), Olmo2())
}


def dense_family(cfg: ModelConfig) -> Family:
    """The dense family an archlab layout maps to, by this table (its ``check`` then refuses what it cannot
    hold; a moe MLP or mla attention goes to ``hf_sparse.sparse_family`` instead):

    ============================================================  ============
    pre-norm, learned positions                                   GPT-2
    parallel block, one shared norm, RoPE, no q/k/v bias          GPT-J
    parallel block, one shared norm, RoPE, q/k/v bias             Phi
    parallel block with two norms, or pre-norm LayerNorm; RoPE    GPT-NeoX
    pre-norm RMSNorm + RoPE, with a (1 + w) norm or scaled emb.   Gemma
    ... else with a per-head QK-norm                              Qwen3
    ... else with q/k/v biases but no output bias                 Qwen2
    ... else with a sliding window                                Mistral
    ... else                                                      LLaMA
    sandwich block, RoPE                                          Gemma 2
    post_sublayer block, RoPE                                     OLMo 2
    ============================================================  ============
    """
    block, position, a = cfg.block.kind, cfg.position.kind, cfg.attention
    if block == "pre" and position == "learned":
        return DENSE["gpt2"]
    if block not in ("pre", "parallel", "sandwich", "post_sublayer"):
        raise ConfigError(
            "model.block.kind",
            block,
            "pre, parallel, sandwich (Gemma 2) or post_sublayer (OLMo 2) to convert to Hugging Face",
        )
    if position != "rope":
        allowed = (
            "learned (GPT-2) or rope (every other family)" if block == "pre" else f"rope with model.block.kind={block}"
        )
        raise ConfigError("model.position.kind", position, f"{allowed} to convert to Hugging Face")
    if block == "parallel":
        if not cfg.block.shared_norm:
            return DENSE["gpt_neox"]
        return DENSE["phi" if a.qkv_bias else "gptj"]
    if block == "sandwich":
        return DENSE["gemma2"]
    if block == "post_sublayer":
        return DENSE["olmo2"]
    if cfg.norm.kind == "layernorm":
        return DENSE["gpt_neox"]
    if cfg.norm.unit_offset or cfg.scale_embedding:
        return DENSE["gemma"]
    if a.qk_norm == "head":
        return DENSE["qwen3"]
    if a.qkv_bias and not a.out_bias:
        return DENSE["qwen2"]
    if a.window is not None:
        return DENSE["mistral"]
    return DENSE["llama"]
