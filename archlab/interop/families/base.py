"""What every Hugging Face family record shares: the ``Family`` base class, the optional parts
of a layout (``FEATURES``) a family must hold or refuse, tensor maps and their layouts, the activation
names, and the helpers that read and refuse transformers config fields. Nothing here imports
transformers: records read configs by attribute."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, NoReturn

import torch
from torch import Tensor

from archlab.config import (
    MLP_OPTIONS,
    ModelConfig,
    n_kv_head,
)
from archlab.config.layers import layer_configs, layer_kind
from archlab.errors import ConfigError
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff
from archlab.nn.moe import RoutingConfig
from archlab.nn.rope import rotary_dim

Rule = tuple[str, tuple, str]  # (field "model.a.b", the values a family can hold, why)


# the rules many families state, declared once
ONE_BIAS_FLAG = " (one attention_bias flag sets q/k/v and output)"
NO_HEAD_BIAS: Rule = ("model.head.bias", (False,), "")


def out_bias(value: bool, why: str = "") -> Rule:
    """``model.attention.out_bias`` must be ``value``: a family's fixed output bias, or its q/k/v bias's
    where one flag sets both (``ONE_BIAS_FLAG``)."""
    return ("model.attention.out_bias", (value,), why)


def ungrouped(why: str = " (its router has no expert groups)") -> Rule:
    """``model.mlp.n_groups`` must be 1: a router that ranks every expert at once."""
    return ("model.mlp.routing.n_groups", (1,), why)


class Problem(NamedTuple):
    """A field whose value a family cannot hold: what it needs instead (``wants``) and why."""

    field: str  # "model.a.b"
    value: Any
    wants: str  # "rmsnorm", "swiglu or geglu", "head_dim=64 (full rotary)"
    why: str = ""  # " (its experts are gated)": appended to the refusal


# mamba2 draws dt_bias from these; gated_deltanet too where dt_bias_init is null

# Optional parts of a layout, at the value that means "absent". A family lists the ones it holds in
# ``Family.features``; every other one must stay at this value.
FEATURES: dict[str, tuple[Any, str]] = {
    "model.dropout": (0.0, "no embedding or residual dropout"),
    "model.embedding_dropout": (None, "the embeddings dropped at model.dropout's rate, if at all"),
    "model.scale_embedding": (False, "unscaled embeddings"),
    "model.embedding_norm": (False, "no norm on the token embeddings"),
    "model.embedding_multiplier": (1.0, "unscaled embeddings"),
    "model.embedding_dim": (None, "token embeddings of d_model, no projections"),
    "model.block.residual_multiplier": (1.0, "sublayer outputs added to the residual stream unscaled"),
    "model.head.logit_scale": (1.0, "unscaled logits"),
    "model.norm.unit_offset": (False, "norm scales stored as w"),
    "model.norm.affine": (True, "norms with a learned scale"),
    "model.attention.qk_norm": ("none", "no QK-norm"),
    "model.attention.qk_norm_after_rope": (False, "QK-norm before RoPE"),
    "model.attention.qk_norm_per_head_scale": (False, "one QK-norm scale shared by the heads"),
    "model.attention.qk_norm_bias": (None, "QK-norm shifts as model.norm.bias"),
    "model.attention.latent_norm_eps": (None, "mla's latent norms at model.norm.eps"),
    "model.attention.clip_qkv": (None, "q, k and v unclipped"),
    "model.attention.scale": (None, "scores scaled by 1/sqrt(head_dim)"),
    "model.attention.softcap": (None, "no score soft-capping"),
    "model.attention.window": (None, "no sliding window"),
    "model.attention.chunk": (None, "no chunked attention"),
    "model.attention.sinks": (False, "no attention sinks"),
    "model.attention.gate": ("none", "no attention output gate"),
    "model.attention.query_scale_beta": (None, "queries not scaled by position"),
    "model.attention.query_scale_by": ("index", "queries scaled by their index in the cache"),
    "model.head.softcap": (None, "no logit soft-capping"),
    "model.position.scaling.kind": ("none", "unscaled RoPE"),
    "model.position.scaling.truncate": (True, "YaRN's band rounded outward"),
    "model.position.scaling.softmax_mscale": (True, "YaRN's mscale_all_dim read as DeepSeek's, the softmax scaled too"),
    "model.position.scaling.short_factor": (None, "no LongRoPE factors"),
    "model.position.scaling.long_factor": (None, "no LongRoPE factors"),
    "model.position.scaling.attention_factor": (None, "RoPE's attention factor derived from its scaling"),
    "model.position.alibi_scale": (1.0, "ALiBi's slopes as Press et al."),
    "model.position.alibi_rounding": ("none", "ALiBi's bias in float32"),
    "model.layers.first": ([], "every layer the same parts"),
    "model.layers.pattern": ([], "every layer the same parts"),
    "model.mlp.swiglu_limit": (None, "no SwiGLU clamp"),
    "model.mlp.shared_swiglu_limit": (None, "shared experts clamped as the routed ones"),
    "model.mlp.shared_expert_gate": (False, "shared experts added ungated"),
    "model.mlp.swiglu_alpha": (1.0, "a SiLU gate"),
    "model.mlp.up_offset": (0.0, "no offset on the up projection"),
    "model.mlp.routing.router_bias": (False, "no router bias"),
    "model.mlp.routing.weight_input": (False, "routing weights on the experts' outputs"),
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


def fmt(value: Any) -> str:
    """A value as it is written in YAML: true, false, null, 'text', 1.0."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    return repr(value)


def bare(value: Any) -> str:
    """A value as it is typed in a ``key=value`` override: text unquoted, else as ``fmt`` writes it."""
    return value if isinstance(value, str) else fmt(value)


def has_field(cfg: ModelConfig, field: str) -> bool:
    """Whether ``cfg`` has ``model.a.b`` (a mixer's field exists only where that mixer is chosen)."""
    try:
        value_of(cfg, field)
    except AttributeError:
        return False
    return True


def differences(have: Any, want: Any) -> list[tuple[str, Any, Any]]:
    """(field, value, wanted) for each field of config section ``have`` that differs from ``want``'s (a
    sub-config's as ``routing.top_k``); an option of another kind differs in its kind alone (the rest are
    that option's own fields)."""
    if type(have) is not type(want):
        return [("kind", have.kind, want.kind)]
    out = []
    for f in dataclasses.fields(have):
        a, b = getattr(have, f.name), getattr(want, f.name)
        if dataclasses.is_dataclass(a) and type(a) is type(b):
            out += [(f"{f.name}.{name}", x, y) for name, x, y in differences(a, b)]
        elif a != b:
            out.append((f.name, a, b))
    return out


def leaf_fields(section: Any, prefix: str) -> list[str]:
    """``prefix.<field>`` for each field of config ``section``, a sub-config's one by one
    (``model.position.scaling.factor``)."""
    out = []
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            out += leaf_fields(value, f"{prefix}.{f.name}")
        else:
            out.append(f"{prefix}.{f.name}")
    return out


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
    archlab holds [E, 2f, d] and [E, 2f], the gate rows, then the up rows); ``flat`` (a tensor of shape
    ``sizes`` that archlab holds flattened: Cohere's per-head QK-norm scale [H, hd]); ``kv_grouped`` (Falcon's new
    decoder architecture: per key/value head g, its G = H / KV queries, then k_g, then v_g; ``sizes`` =
    (n_head, n_kv_head, head_dim)); ``offset_rows`` (OPT's position table: HF's rows from ``sizes[0]`` on are
    archlab's, the rows before them, which no token reads, written as zeros); ``qvk_sharded`` (CodeGen's fused
    qkv_proj: ``sizes[0]`` shards, each its slice of q, then of v, then of k); ``stacked_half_negated``
    (``stacked`` q, k, v of ``sizes[:3]`` rows, the second half of each q and k head's ``sizes[3]`` rows
    negated: NanoChat's RoPE turns the other way, which archlab's holds with those rows' signs flipped);
    ``gated_queries`` (Qwen3-Next's q_proj [H·2·hd] holds per head its query rows, then its output gate's:
    archlab's q/k/v from the query rows, k_proj and v_proj, ``sizes`` = (n_head, head_dim); written back
    with the gate's rows from ``others``, archlab's gate) and ``gated_queries_gate`` (archlab's gate, read
    from the gate rows; written by the ``gated_queries`` map); ``deltanet_grouped`` (Qwen3-Next's Gated
    DeltaNet in_proj_qkvz holds per key head g its q_g, k_g, then the v and z rows of the value heads it
    serves, and in_proj_ba per key head their b, then their a; archlab's in_proj holds every q, k, v, z, b,
    then a; ``sizes`` = (key_heads, key_head_dim, n_head, v_head_dim)); ``depthwise_conv`` (nn.Conv1d's
    depthwise weight [C, 1, K], archlab's [C, K])."""

    archlab: str
    hf: tuple[str, ...]
    layout: str = "same"
    sizes: tuple[int, ...] = ()
    others: tuple[str, ...] = ()  # further archlab tensors the HF tensors hold, which ``split`` reads too


def _negate_halves(x: Tensor, rows: int, hd: int) -> Tensor:
    """A copy of ``x`` with the second half of each head of ``hd`` rows among its first ``rows`` negated."""
    y = x.clone()
    y[:rows].unflatten(0, (-1, 2, hd // 2))[:, 1].neg_()
    return y


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
    if m.layout == "flat":
        return parts[0].flatten().clone() if copy else parts[0].flatten()
    if m.layout == "kv_grouped":
        H, KV, hd = m.sizes
        G = H // KV
        groups = parts[0].unflatten(0, (KV, G + 2, hd))
        return torch.cat((groups[:, :G].flatten(0, 2), groups[:, G].flatten(0, 1), groups[:, G + 1].flatten(0, 1)))
    if m.layout == "offset_rows":
        return parts[0][m.sizes[0] :].clone()
    if m.layout == "qvk_sharded":
        q, v, k = parts[0].unflatten(0, (m.sizes[0], 3, -1)).unbind(1)
        return torch.cat((q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)))
    if m.layout == "stacked_half_negated":
        return _negate_halves(torch.cat(parts), m.sizes[0] + m.sizes[1], m.sizes[3])
    if m.layout == "gate_up_interleaved":
        rows = parts[0].transpose(1, 2) if parts[0].dim() == 3 else parts[0]
        return torch.cat((rows[:, 0::2], rows[:, 1::2]), dim=1).contiguous()
    if m.layout == "experts_flat":  # DBRX's experts: [E·f, d] each; archlab's [E, f·len(parts), d], E = sizes[0]
        return torch.cat([p.unflatten(0, (m.sizes[0], -1)) for p in parts], dim=1)
    if m.layout == "experts_flat_transposed":  # DBRX's w2 [E·f, d]: archlab's down [E, d, f]
        return parts[0].unflatten(0, (m.sizes[0], -1)).transpose(1, 2).contiguous()
    if m.layout in ("gated_queries", "gated_queries_gate"):
        H, hd = m.sizes
        rows = parts[0].unflatten(0, (H, 2, hd))[:, int(m.layout == "gated_queries_gate")].flatten(0, 1)
        return torch.cat((rows, *parts[1:])) if m.layout == "gated_queries" else rows.clone()
    if m.layout == "deltanet_grouped":
        Hk, dk, H, dv = m.sizes
        r = H // Hk  # value heads per key head
        q, k, v, z = parts[0].unflatten(0, (Hk, -1)).split((dk, dk, r * dv, r * dv), dim=1)
        b, a = parts[1].unflatten(0, (Hk, 2 * r)).split((r, r), dim=1)
        return torch.cat([x.flatten(0, 1) for x in (q, k, v, z, b, a)])
    if m.layout == "depthwise_conv":
        return parts[0][:, 0].clone()
    return parts[0].detach().clone() if copy else parts[0]


def split(m: TensorMap, tensor: Tensor, others: tuple[Tensor, ...] = ()) -> list[Tensor]:
    """The HF tensors of ``m`` from the archlab one and the ``others`` it names (the inverse of ``join``)."""
    if m.layout == "stacked":
        return [part.clone() for part in tensor.split(m.sizes)]
    if m.layout == "transposed":
        return [tensor.t().contiguous()]
    if m.layout == "heads_interleaved":
        H, hd = m.sizes
        return [tensor.unflatten(0, (3, H, hd)).transpose(0, 1).flatten(0, 2).contiguous()]
    if m.layout == "experts_transposed":
        return [tensor.transpose(1, 2).contiguous()]
    if m.layout == "flat":
        return [tensor.reshape(m.sizes).contiguous()]
    if m.layout == "kv_grouped":
        H, KV, hd = m.sizes
        q, k, v = tensor.split((H * hd, KV * hd, KV * hd))
        q, k, v = q.unflatten(0, (KV, H // KV, hd)), k.unflatten(0, (KV, 1, hd)), v.unflatten(0, (KV, 1, hd))
        return [torch.cat((q, k, v), dim=1).flatten(0, 2).contiguous()]
    if m.layout == "offset_rows":
        return [torch.cat((tensor.new_zeros(m.sizes[0], *tensor.shape[1:]), tensor))]
    if m.layout == "qvk_sharded":
        q, k, v = (x.unflatten(0, (m.sizes[0], -1)) for x in tensor.chunk(3))
        return [torch.stack((q, v, k), dim=1).flatten(0, 2).contiguous()]
    if m.layout == "stacked_half_negated":
        return list(_negate_halves(tensor, m.sizes[0] + m.sizes[1], m.sizes[3]).split(m.sizes[:3]))
    if m.layout == "gate_up_interleaved":
        f = tensor.shape[1] // 2
        rows = torch.stack((tensor[:, :f], tensor[:, f:]), dim=2).flatten(1, 2)
        return [(rows.transpose(1, 2) if rows.dim() == 3 else rows).contiguous()]
    if m.layout == "experts_flat":
        return [x.flatten(0, 1).contiguous() for x in tensor.chunk(len(m.hf), dim=1)]
    if m.layout == "experts_flat_transposed":
        return [tensor.transpose(1, 2).flatten(0, 1).contiguous()]
    if m.layout == "gated_queries":
        H, hd = m.sizes
        q, kv = tensor.split((H * hd, tensor.shape[0] - H * hd))
        rows = torch.stack((q.unflatten(0, (H, hd)), others[0].unflatten(0, (H, hd))), dim=1).flatten(0, 2)
        return [rows.contiguous(), *(part.clone() for part in kv.chunk(2))]
    if m.layout == "gated_queries_gate":
        return []  # the gated_queries map writes q_proj, gate rows included
    if m.layout == "deltanet_grouped":
        Hk, dk, H, dv = m.sizes
        q, k, v, z, b, a = (x.unflatten(0, (Hk, -1)) for x in tensor.split((Hk * dk, Hk * dk, H * dv, H * dv, H, H)))
        return [torch.cat((q, k, v, z), dim=1).flatten(0, 1), torch.cat((b, a), dim=1).flatten(0, 1)]
    if m.layout == "depthwise_conv":
        return [tensor[:, None].clone()]
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


# ---------------------------------------------------------------- the records


class Family:
    """One Hugging Face family. Subclasses set the class attributes and implement the four methods.
    ``keys`` declares the config fields copied as they are both ways (HF key -> archlab field under
    ``model.``); ``to_hf`` and ``from_hf`` add them with ``keys_to_hf`` and ``keys_from_hf`` and compute
    the rest."""

    model_type: str  # transformers' config.model_type
    title: str  # the family's name in messages
    model_class: str
    config_class: str
    prefix: str  # the base model's tensor prefix, absent from checkpoints saved from the base model alone
    features: frozenset[str] = frozenset()  # the FEATURES this family holds
    attention_kind = "causal"  # the model.attention.kind its layers have
    position_kind: str | tuple[str, ...] = "rope"  # the model.position.kind it holds (or the kinds: Falcon's two)
    position_why = ""  # why, in its refusal
    scalings: tuple[str, ...] = ("none", "linear", "llama3")  # RoPE scalings, if it holds model.position.scaling.kind
    renames: dict[str, str] = {}  # older checkpoints' tensor-name prefixes -> today's
    parts = ""  # the archlab parts the class maps to, in a line (archlab-interop's table and docs/interop.md)
    keys: dict[str, str] = {}  # HF config key -> archlab field ("d_model", "norm.eps"), copied as is
    # a family whose layouts another family holds too (an alias, a relative, a later version): ``FAMILIES``
    # lists it after the families that do not defer, so ``hf.family_of`` picks the other where both hold one
    defers = False

    def keys_to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        """The HF keyword arguments of ``keys``: each field's value in ``cfg``."""
        return {key: value_of(cfg, f"model.{field}") for key, field in self.keys.items()}

    def keys_from_hf(self, c: Any, cfg: ModelConfig) -> ModelConfig:
        """``cfg`` with each field of ``keys`` set to its HF config key's value in ``c``."""
        for key, field in self.keys.items():
            *path, name = field.split(".")
            obj: Any = cfg
            for part in path:
                obj = getattr(obj, part)
            setattr(obj, name, getattr(c, key))
        return cfg

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        """What the family requires of the layout beyond the absent FEATURES."""
        return []

    mixer_kinds: tuple[str, ...] = ()  # the mixers its layers may have beside attention_kind (a hybrid's)

    def problems(self, cfg: ModelConfig) -> list[Problem]:
        """Every field (``model.a.b``) whose value this family cannot hold exactly, in the order ``check``
        meets them: ``archlab-check`` lists them all at once. A mixer this family has not (``mixer_problems``)
        is the one problem: the family's other rules read fields of the mixers it has."""
        return self.mixer_problems(cfg) or self.part_problems(cfg)

    def mixer_problems(self, cfg: ModelConfig) -> list[Problem]:
        """The model's mixer where it is not ``attention_kind``, and each layer kind's that is none of this
        family's mixers."""
        found = []
        if cfg.attention.kind != self.attention_kind:
            found.append(Problem("model.attention.kind", cfg.attention.kind, self.attention_kind, ""))
        allowed = (self.attention_kind, *self.mixer_kinds)
        for i, lc in enumerate(layer_configs(cfg)):
            kind = layer_kind(cfg, i)
            field = kind_field(cfg, kind, "model.attention.kind")
            if kind is not None and lc.attention.kind not in allowed and field not in {p.field for p in found}:
                found.append(Problem(field, lc.attention.kind, " or ".join(allowed), ""))
        return found

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``problems`` of a layout whose mixers this family has: the fields it cannot hold."""
        # a feature's field the chosen mixer has not is not set: nothing to refuse
        absent = [
            (f, (default,), f" ({why})")
            for f, (default, why) in FEATURES.items()
            if f not in self.features and has_field(cfg, f)
        ]
        kinds = (self.position_kind,) if isinstance(self.position_kind, str) else self.position_kind
        rules: list[Rule] = [  # the mixers: mixer_problems, already
            ("model.position.kind", kinds, self.position_why),
            ("model.head.kind", ("linear",), ""),
        ]
        if "model.position.scaling.kind" in self.features:
            rules.append(("model.position.scaling.kind", self.scalings, ""))
        found = []
        for field, allowed, why in rules + self.rules(cfg) + absent:
            if not has_field(cfg, field):  # a field of another option (an MLP's of another kind): not set
                continue
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
        if cfg.position.kind != "rope" or rotary_dim(cfg) == head_dim(cfg):
            return []
        if cfg.position.rotary_fraction is not None:  # the field the user set
            return [
                Problem("model.position.rotary_fraction", cfg.position.rotary_fraction, "null or 1.0 (full rotary)")
            ]
        return [
            Problem("model.position.rotary_dim", rotary_dim(cfg), f"null or {head_dim(cfg)}=head_dim (full rotary)")
        ]


def dropouts(residual: Any, embedding: Any) -> dict[str, Any]:
    """``model.dropout`` and ``model.embedding_dropout`` of an HF family that drops each sublayer's output
    at ``residual`` and the embeddings at ``embedding``: null where the two are equal, so a family with one
    rate reads as before. A family that drops no embeddings passes ``embedding`` 0.0."""
    residual, embedding = float(residual), float(embedding)
    return {"dropout": residual, "embedding_dropout": None if embedding == residual else embedding}


def no_embedding_dropout(cfg: ModelConfig, title: str) -> Rule:
    """The rule of a family that drops sublayer outputs but never its embeddings (OPT, BLOOM, Phi-3):
    ``model.embedding_dropout`` 0.0 beside a non-zero ``model.dropout``, and null (the absent value of
    every family, as ``dropouts`` reads it) beside 0, so a model without dropout has one spelling and
    goes to the family its parts route to."""
    allowed = (None,) if cfg.dropout == 0.0 else (0.0,)
    why = f" ({title} drops no embeddings: 0.0 beside a non-zero model.dropout, null beside 0)"
    return ("model.embedding_dropout", allowed, why)


ROUTING_FIELDS = frozenset(f.name for f in dataclasses.fields(RoutingConfig))


def mlp_section(kind: str, approximate: str = "none", **fields: Any) -> Any:
    """archlab's MLP of ``kind`` with ``fields``, written flat as a Hugging Face config holds them (a
    mixture of experts' router fields go under ``routing``): the form of the activation Hugging Face's
    name gave, ``approximate``, kept where the kind has that field (GELU's kinds, a mixture of experts);
    the other kinds have no tanh form to hold."""
    routing = {**fields.pop("routing", {}), **{k: fields.pop(k) for k in list(fields) if k in ROUTING_FIELDS}}
    if routing:
        fields["routing"] = routing
    if "approximate" in MLP_OPTIONS.fields(kind):
        fields["approximate"] = approximate
    elif approximate != "none":
        raise ConfigError("model.mlp.approximate", approximate, f"none for {kind} (it has no tanh form)")
    return MLP_OPTIONS.make(kind=kind, **fields)


def activation(mlp: Any) -> tuple[str, str]:
    """The activation an MLP section runs, as the tables to Hugging Face's names key it: (kind, approximate),
    a mixture of experts' its experts' kind; "none" where the kind has no tanh form."""
    return (mlp.expert if mlp.kind == "moe" else mlp.kind), getattr(mlp, "approximate", "none")


def shared_experts(mlp: Any) -> int:
    """A mixture of experts' shared experts; none for a dense MLP."""
    return mlp.n_shared_experts if mlp.kind == "moe" else 0


def dense_of(mlp: Any) -> Any:
    """A mixture of experts' section as one dense MLP of its experts' kind, with the fields they share (what
    its dense layers are); a dense section as it is."""
    return MLP_OPTIONS.build({"kind": mlp.expert}, "model.mlp", base=mlp) if mlp.kind == "moe" else mlp


def plain_mlp(c: Any, act: str, width: int) -> Any:
    """act(fc(x)) with biases, its activation read from the config key ``act``."""
    name = getattr(c, act)
    if name not in PLAIN_FROM_HF:
        refuse_hf(c, act, f"one of {sorted(PLAIN_FROM_HF)}")
    kind, approximate = PLAIN_FROM_HF[name]
    return mlp_section(kind, d_ff=width, bias=True, approximate=approximate)


def config_head_dim(c: Any) -> int:
    """A transformers config's head size: its ``head_dim`` where set, else hidden_size / heads."""
    return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


def gated_activation(c: Any, act: str = "hidden_act") -> tuple[str, str]:
    """archlab's (kind, approximate) of a gated MLP's activation, read from the config key ``act``;
    refused, naming it, where archlab has no such gated kind."""
    name = getattr(c, act)
    if name not in GATED_FROM_HF:
        refuse_hf(c, act, f"one of {sorted(GATED_FROM_HF)}")
    return GATED_FROM_HF[name]


def gated_mlp(c: Any, act: str) -> Any:
    """down(act(gate(x)) * up(x)) without biases, its activation read from the config key ``act``."""
    kind, approximate = gated_activation(c, act)
    return mlp_section(kind, d_ff=c.intermediate_size, bias=False, approximate=approximate)


def plain_activation(cfg: ModelConfig) -> str:
    return PLAIN_TO_HF[activation(cfg.mlp)]
