"""The Hugging Face family record (``Family``): what a record declares, and how it finds the fields of a
layout it cannot hold (the optional parts, ``FEATURES``, it must hold or refuse; the rules many families
state). Nothing here imports transformers: records read configs by attribute."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Optional

from torch import Tensor

from archlab.config import ModelConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.errors import ConfigError
from archlab.interop.families.tensors import TensorMap
from archlab.interop.families.values import differences, has_field, kind_field, value_of
from archlab.nn.mixers.base import head_dim
from archlab.nn.mtp import with_depth
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
    allowed: tuple = ()  # the values it holds, where they can be listed: the export hint sets the first


Check = Callable[[ModelConfig], list[Problem]]  # the problems a family finds beyond its rules


# Optional parts of a layout, at the value that means "absent". A family lists the ones it holds in
# ``Family.features``; every other one must stay at this value.
FEATURES: dict[str, tuple[Any, str]] = {
    "model.dropout": (0.0, "no embedding or residual dropout"),
    "model.linear.kind": ("dense", "full-precision projections"),
    "model.stream.kind": ("plain", "one residual stream"),
    "model.embedding_dropout": (None, "the embeddings dropped at model.dropout's rate, if at all"),
    "model.scale_embedding": (False, "unscaled embeddings"),
    "model.embedding_norm": (False, "no norm on the token embeddings"),
    "model.embedding_multiplier": (1.0, "unscaled embeddings"),
    "model.embedding_dim": (None, "token embeddings of d_model, no projections"),
    "model.block.residual_multiplier": (1.0, "sublayer outputs added to the residual stream unscaled"),
    "model.block.residual_rule": ("constant", "each residual add x + f(x), not depth-scaled"),
    "model.block.attn_norm": (True, "a norm before every layer's attention"),
    "model.block.mlp_norm": (True, "a norm before every layer's MLP"),
    "model.block.final_norm": (True, "a norm before the head"),
    "model.head.logit_scale": (1.0, "unscaled logits"),
    "model.head.mtp.depth": (0, "no multi-token prediction modules"),
    "model.head.vocab": (None, "a head row for every vocabulary id"),
    "model.norm.unit_offset": (False, "norm scales stored as w"),
    "model.norm.affine": (True, "norms with a learned scale"),
    "model.attention.qk_norm": ("none", "no QK-norm"),
    "model.attention.qk_norm_after_rope": (False, "QK-norm before RoPE"),
    "model.attention.qk_norm_per_head_scale": (False, "one QK-norm scale shared by the heads"),
    "model.attention.qk_norm_bias": (None, "QK-norm shifts as model.norm.bias"),
    "model.attention.latent_norm_eps": (None, "mla's latent norms at model.norm.eps"),
    "model.attention.latent_scale": (False, "mla's normed latents unscaled"),
    "model.attention.rope_key_norm": (False, "mla's shared rotated key unnormed"),
    "model.attention.q_latent": ("normed", "mla's queries from the normed q latent"),
    "model.attention.gate_input": ("x", "an output gate of the layer's input"),
    "model.attention.clip_qkv": (None, "q, k and v unclipped"),
    "model.attention.scale": (None, "scores scaled by 1/sqrt(head_dim)"),
    "model.attention.softcap": (None, "no score soft-capping"),
    "model.attention.window": (None, "no sliding window"),
    "model.attention.chunk": (None, "no chunked attention"),
    "model.attention.sinks": (False, "no attention sinks"),
    "model.attention.value_residual": (False, "no value residual"),
    "model.attention.v_norm": (False, "values unnormed"),
    "model.attention.v_from_k": (False, "values of their own projection"),
    "model.attention.kv_shared": (False, "every layer its own keys and values"),
    "model.block.layer_scalar": (False, "no fixed scalar per layer"),
    "model.block.laurel_rank": (0, "no LAuReL beside attention"),
    "model.mlp.activation_sparsity": (0.0, "dense MLP activations"),
    "model.block.attn_norm_gate": (None, "the norm before attention ungated"),
    "model.block.mlp_norm_gate": (None, "the norm before the MLP ungated"),
    "model.per_layer_input.dim": (0, "no per-layer inputs"),
    "model.ngram_input.layers": ([], "no hashed n-gram inputs"),
    "model.attention.gate": ("none", "no attention output gate"),
    "model.attention.gate_activation": ("sigmoid", "a sigmoid output gate"),
    "model.attention.v_head_dim": (None, "value heads as wide as the query/key heads"),
    "model.attention.sub_norm": (False, "no norm on the heads' output"),
    "model.attention.query_scale_beta": (None, "queries not scaled by position"),
    "model.attention.query_scale_by": ("index", "queries scaled by their index in the cache"),
    "model.attention.query_scale_form": ("log", "queries scaled by 1 + β·log(1 + ⌊(p + offset) / length⌋)"),
    "model.attention.gate_head_bias": (False, "no per-head bias on the output gate"),
    "model.attention.gate_norm": ("after", "Mamba-2's gated norm, norm(y·silu(z))"),
    "model.attention.heads": (1, "one Mamba-1 head: one x_proj and dt_proj for every channel"),
    "model.head.softcap": (None, "no logit soft-capping"),
    "model.position.turning_fraction": (None, "every rotated pair of RoPE turning"),
    "model.position.scaling.kind": ("none", "unscaled RoPE"),
    "model.position.scaling.truncate": (True, "YaRN's band rounded outward"),
    "model.position.scaling.softmax_mscale": (True, "YaRN's mscale_all_dim read as DeepSeek's, the softmax scaled too"),
    "model.position.scaling.short_factor": (None, "no LongRoPE factors"),
    "model.position.scaling.long_factor": (None, "no LongRoPE factors"),
    "model.position.scaling.attention_factor": (None, "RoPE's attention factor derived from its scaling"),
    "model.position.scaling.long_attention_factor": (None, "LongRoPE's one attention factor at every length"),
    "model.position.scaling.switch_factors": (True, "LongRoPE's long factors past its original context"),
    "model.position.alibi_scale": (1.0, "ALiBi's slopes as Press et al."),
    "model.position.alibi_rounding": ("none", "ALiBi's bias in float32"),
    "model.layers.first": ([], "every layer the same parts"),
    "model.layers.pattern": ([], "every layer the same parts"),
    "model.layers.shared.layers": ([], "no shared blocks"),
    "model.mlp.swiglu_limit": (None, "no SwiGLU clamp"),
    "model.mlp.shared_swiglu_limit": (None, "shared experts clamped as the routed ones"),
    "model.mlp.shared_expert_gate": (False, "shared experts added ungated"),
    "model.mlp.out_norm": (False, "the MoE's output unnormed"),
    "model.mlp.out_bias": (False, "no bias on the MoE's output"),
    "model.mlp.sub_norm": (False, "no norm on the MLP's hidden activations"),
    "model.mlp.swiglu_alpha": (1.0, "a SiLU gate"),
    "model.mlp.up_offset": (0.0, "no offset on the up projection"),
    "model.mlp.routing.router_bias": (False, "no router bias"),
    "model.mlp.routing.correction_on": ("scores", "the correction bias added to the router's scores"),
    "model.mlp.routing.weight_input": (False, "routing weights on the experts' outputs"),
    "model.mlp.routing.sparsemixer_eps": (None, "plain top-k routing"),
    "model.mlp.routing.selection": ("scores", "experts chosen by the router's scores"),
    "model.mlp.routing.router_norm": (False, "the router reads the MoE's input"),
    "model.mlp.routing.expert_scale": (False, "no learned scale per expert"),
    "model.mlp.beside": (False, "no MLP beside the experts"),
    "model.mlp.routing.zero_experts": (0, "no zero (identity) experts"),
}
LAYERS = frozenset({"model.layers.first", "model.layers.pattern"})  # the FEATURES of layers that differ
# FEATURES a layer kind sets too (Gemma 3n's sparse first layers): checked in every layer of a family without them
PER_LAYER_FEATURES = ("model.mlp.activation_sparsity",)
# FEATURES of the causal mixer whose name another mixer's own field shares (mla's v_head_dim is its size)
CAUSAL_ONLY = frozenset({"model.attention.v_head_dim"})


def fmt(value: Any) -> str:
    """A value as it is written in YAML: true, false, null, 'text', 1.0."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    return repr(value)


def bare(value: Any) -> str:
    """A value as it is typed in a ``key=value`` override: text unquoted, else as ``fmt`` writes it."""
    return value if isinstance(value, str) else fmt(value)


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
    # the config keys counting a checkpoint's multi-token prediction modules (the first set), which
    # ``families/mtp.py`` reads and writes beside the model by the names of ``mtp_scheme`` (layers: after the
    # model's, DeepSeek-V3's; mtp: Qwen3-Next's mtp.*), their blocks of layer kind ``mtp_layer_kind`` (None:
    # the model's own parts); no keys: a family whose modules archlab does not read
    mtp_keys: tuple[str, ...] = ()
    mtp_scheme = "layers"
    mtp_layer_kind: str | None = None
    mtp_stacked = False  # its checkpoints stack a module's experts as save_pretrained does (else one tensor each)
    # a family whose layouts another family holds too (an alias, a relative, a later version): ``FAMILIES``
    # lists it after the families that do not defer, so ``hf.family_of`` picks the other where both hold one
    defers = False

    def with_mtp(self, cfg: ModelConfig, c: Any, depth: int) -> ModelConfig:
        """``cfg`` (read from transformers config ``c``) with the ``depth`` modules its checkpoint holds, their
        blocks of kind ``mtp_layer_kind`` (a family whose modules' layer its config describes reads it)."""
        return with_depth(cfg, depth, self.mtp_layer_kind)

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
        is the one problem: the family's other rules read fields of the mixers it has. No family runs layers
        again (``model.layers.loop``), whatever its parts: the whole model's field, which no layer's config has."""
        passes = cfg.layers.loop.passes
        loop = (
            [] if passes == 1 else [Problem("model.layers.loop.passes", passes, "1", " (every layer run once)", (1,))]
        )
        return self.mixer_problems(cfg) or self.part_problems(cfg) + loop

    def mixer_problems(self, cfg: ModelConfig) -> list[Problem]:
        """The model's mixer where it is not ``attention_kind``, and each layer kind's that is none of this
        family's mixers."""
        found = []
        if cfg.attention.kind != self.attention_kind:
            found.append(
                Problem("model.attention.kind", cfg.attention.kind, self.attention_kind, "", (self.attention_kind,))
            )
        allowed = (self.attention_kind, *self.mixer_kinds)
        for i, lc in enumerate(layer_configs(cfg)):
            kind = layer_kind(cfg, i)
            field = kind_field(cfg, kind, "model.attention.kind")
            if kind is not None and lc.attention.kind not in allowed and field not in {p.field for p in found}:
                found.append(Problem(field, lc.attention.kind, " or ".join(allowed), "", allowed))
        return found

    block_kinds = False  # whether its layers may differ in their block (model.layers.kinds.<kind>.block)
    head_kinds: tuple[str, ...] = ("linear",)  # the model.head.kind values it holds
    tied_head = "lm_head.weight"  # the HF name of the head's matrix, the embedding's where tied

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """``problems`` of a layout whose mixers this family has: the fields it cannot hold (a layer kind's
        block, unless ``block_kinds``: the model's block is every layer's in most families)."""
        # a feature's field the chosen mixer has not is not set: nothing to refuse
        absent = [
            (f, (default,), f" ({why})")
            for f, (default, why) in FEATURES.items()
            if f not in self.features and has_field(cfg, f) and (f not in CAUSAL_ONLY or cfg.attention.kind == "causal")
        ]
        kinds = (self.position_kind,) if isinstance(self.position_kind, str) else self.position_kind
        rules: list[Rule] = [  # the mixers: mixer_problems, already
            ("model.position.kind", kinds, self.position_why),
            ("model.head.kind", self.head_kinds, ""),
        ]
        if "model.position.scaling.kind" in self.features:
            rules.append(("model.position.scaling.kind", self.scalings, ""))
        found = [] if self.block_kinds else block_kind_problems(cfg, self.title)
        found += kind_problems(cfg, "stream", f" ({self.title}'s layers share one residual stream)")
        found += per_layer_feature_problems(cfg, [f for f in PER_LAYER_FEATURES if f not in self.features])
        for field, allowed, why in rules + self.rules(cfg) + absent:
            if not has_field(cfg, field):  # a field of another option (an MLP's of another kind): not set
                continue
            value = value_of(cfg, field)
            if value not in allowed:
                found.append(Problem(field, value, " or ".join(bare(a) for a in allowed), why, tuple(allowed)))
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

    def hf_weights(self, c: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """transformers' tensors (named as the model holds them) as archlab's layout holds them, given the
        config ``c``: the same, but for a scale archlab folds into a weight (Cohere2's logit_scale,
        Falcon-H1's multipliers)."""
        return state

    def to_hf_weights(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """transformers' tensors of archlab's (split and named) as its model holds them: the same, but for
        a layout it stores otherwise (BitNet's packed ternary weights); ``hf_weights``' inverse."""
        return state

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


def section_problems(
    cfg: ModelConfig, kind: Optional[str], wanted: list[tuple[str, Any, Any, str]], title: str
) -> list[Problem]:
    """Each field of layer kind ``kind`` off what the family holds, from (section, the layer's, the family's, why)."""
    return [
        Problem(
            kind_field(cfg, kind, f"model.{section}.{name}"),
            value,
            bare(expected),
            f" ({title} has {why})",
            (expected,),
        )
        for section, have, want, why in wanted
        for name, value, expected in differences(have, want)
    ]


def first_per_field(problems: list[Problem]) -> list[Problem]:
    """``problems`` with each field named once, by its first problem (layers of one kind repeat theirs)."""
    first: dict[str, Problem] = {}
    for p in problems:
        first.setdefault(p.field, p)
    return list(first.values())


def block_kind_problems(cfg: ModelConfig, title: str) -> list[Problem]:
    """Each field of ``block`` that a used layer kind sets away from the model's block, named as the kind's."""
    return kind_problems(cfg, "block", f" ({title}'s layers share one block)")


def kind_problems(cfg: ModelConfig, section: str, why: str) -> list[Problem]:
    """Each field of ``section`` that a used layer kind sets away from the model's, named as the kind's."""
    found = []
    for i, lc in enumerate(layer_configs(cfg)):
        kind = layer_kind(cfg, i)
        changed = differences(getattr(lc, section), getattr(cfg, section)) if kind is not None else []
        for name, value, expected in changed:
            field = kind_field(cfg, kind, f"model.{section}.{name}")
            found.append(Problem(field, value, bare(expected), why, (expected,)))
    return first_per_field(found)


def per_layer_feature_problems(cfg: ModelConfig, fields: list[str]) -> list[Problem]:
    """Each of ``fields`` (FEATURES a family lacks) that a used layer kind sets away from its absent value."""
    found = []
    for i, lc in enumerate(layer_configs(cfg)):
        kind = layer_kind(cfg, i)
        for f in fields if kind is not None else []:
            absent, why = FEATURES[f]
            if has_field(lc, f) and value_of(lc, f) != absent:
                found.append(Problem(kind_field(cfg, kind, f), value_of(lc, f), bare(absent), f" ({why})", (absent,)))
    return first_per_field(found)


def no_embedding_dropout(cfg: ModelConfig, title: str) -> Rule:
    """The rule of a family that drops sublayer outputs but never its embeddings (OPT, BLOOM, Phi-3):
    ``model.embedding_dropout`` 0.0 beside a non-zero ``model.dropout``, and null (the absent value of
    every family, as ``dropouts`` reads it) beside 0, so a model without dropout has one spelling and
    goes to the family its parts route to."""
    allowed = (None,) if cfg.dropout == 0.0 else (0.0,)
    why = f" ({title} drops no embeddings: 0.0 beside a non-zero model.dropout, null beside 0)"
    return ("model.embedding_dropout", allowed, why)
