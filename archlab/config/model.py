"""Structured model configs: the contract every registry family reads (plain dataclasses; Hydra's
ConfigStore holds them, see ``archlab.config.store``).

The token mixer, the position scheme, the MLP and the residual stream are one class per option, each holding
exactly its fields (``MixerConfig``, ``PositionConfig``, ``MLPConfig``, ``StreamConfig`` and the subclass each
option's module registers, ``OPTIONS``); the other families are one dataclass each, whose ``kind`` picks the
variant, whose own entry checks the fields it uses (see ``archlab.nn``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, cast

from omegaconf import DictConfig, OmegaConf

from archlab.config.fields import choice, plain_dict
from archlab.config.options import Options
from archlab.errors import ConfigError


@dataclass
class NormConfig:
    """``model.norm``: the normalisation layer (registry ``NORMS``, archlab/nn/norms.py)."""

    kind: str = "layernorm"  # layernorm | rmsnorm | l2 (onto the unit sphere, no weight: nGPT)
    eps: float = 1e-5
    bias: bool = True  # layernorm only
    affine: bool = True  # false: no learned scale or shift, the norm alone (OLMo 1's LayerNorm); bias unread
    unit_offset: bool = False  # the scale stored as w and applied as (1 + w), w starting at 0 (Gemma, Nemotron)


@dataclass
class BlockConfig:
    """``model.block``: how a block wires attention and MLP into the residual stream (``BLOCKS``, archlab/nn/block.py)."""

    kind: str = "pre"  # pre | post | parallel | post_sublayer | sandwich | normed_skip | ngpt
    shared_norm: bool = True  # parallel only: one norm feeds attention and MLP (GPT-J)
    residual_multiplier: float = 1.0  # each sublayer's output times this as it joins the residual stream (Granite)
    # how each residual add weighs the stream: constant, x + f(x); depth, x·√((i−1)/i) + f(x)/√i at the i-th add (Beam)
    residual_rule: str = choice("constant", "depth")
    attn_norm: bool = (
        True  # pre only: false, attention reads the stream unnormed (ModernBERT's first layer, by layer kind)
    )
    mlp_norm: bool = True  # pre only: false, the MLP reads the stream unnormed (Qwen4-Exp: its streams' read is)
    final_norm: bool = True  # pre only: false, the head reads the last block's output (merged) unnormed (Qwen4-Exp)
    # normed_skip only: h = alpha·norm(x) + beta·sublayer(norm(x)), per sublayer (MiniMax-01's *_alpha/beta_factor)
    attn_alpha: float = 1.0
    attn_beta: float = 1.0
    mlp_alpha: float = 1.0
    mlp_beta: float = 1.0
    # ngpt only: each sublayer's step size α per dim, h + |α|·(norm(f(h)) − h), α starting at alpha_init and
    # stored as α·alpha_scale/alpha_init (nGPT's scaled parameter; None = 1/sqrt(d_model))
    alpha_init: float = 0.05
    alpha_scale: Optional[float] = None
    # ngpt only: after each optimizer step, the ngpt attention's, MLP's and head's matrices (and the token
    # embedding the ngpt head reads) renormalised to unit vectors along d_model, as the paper trains
    unit_weights: bool = True
    # the stream after the layer times a fixed per-layer number: a buffer (1 at init, untrained, kept in the
    # weights), Gemma 4's layer_scalar
    layer_scalar: bool = False
    # pre (with attn_norm) and sandwich: LAuReL's low rank r beside attention, the stream after its add
    # (x + attn(n) + n + norm(B·A·n))/√2, n attention's normed input (Gemma 3n's laurel_rank); 0 none
    laurel_rank: int = 0
    # pre only: the norm before attention / before the MLP times sigmoid(up(silu(down(y)))) of its output y, a gate
    # of this rank (A.X K2's gated RMSNorms: every layer's attention, its MoE layers' MLP); null: ungated
    attn_norm_gate: Optional[int] = None
    mlp_norm_gate: Optional[int] = None


@dataclass
class PositionConfig:
    """``model.position``: the position scheme (registry ``POSITIONS``, archlab/nn/positions.py, RoPE in
    archlab/nn/rope.py). ``kind`` picks it, and its own config class, a subclass registered with
    ``position_config`` beside its scheme, holds exactly the fields it reads."""

    kind: str = "learned"


# the position schemes' config classes, filled as archlab.nn.positions and archlab.nn.rope are imported
POSITION_OPTIONS = Options("position", "position", PositionConfig)
position_config = POSITION_OPTIONS.register  # @position_config(kind): the decorated class is scheme kind's config


@dataclass
class MixerConfig:
    """``model.attention``: the token mixer (registry ``MIXERS``, archlab/nn/mixers/). ``kind`` picks it, and
    its own config class, a subclass registered with ``mixer_config`` beside the mixer, holds exactly the
    fields it reads. ``n_head`` is the one field every mixer has: it stays when an option or a layer kind
    swaps the mixer for another."""

    kind: str = "causal"
    n_head: int = 12


# the mixers' config classes, filled as archlab.nn.mixers' modules are imported (archlab's package import does so
# before any config is read)
MIXER_OPTIONS = Options("attention", "mixer", MixerConfig)
mixer_config = MIXER_OPTIONS.register  # @mixer_config(kind): the decorated MixerConfig subclass is mixer kind's config


@dataclass
class MLPConfig:
    """``model.mlp``: the feed-forward (registry ``MLPS``, archlab/nn/mlp.py, archlab/nn/moe.py). ``kind``
    picks it, and its own config class, a subclass registered with ``mlp_config`` beside its entry, holds
    exactly the fields it reads."""

    kind: str = "gelu"


# the MLPs' config classes, filled as archlab.nn.mlp and archlab.nn.moe are imported
MLP_OPTIONS = Options("mlp", "MLP", MLPConfig, keep_shared=True)
mlp_config = MLP_OPTIONS.register  # @mlp_config(kind): the decorated MLPConfig subclass is MLP kind's config


@dataclass
class StreamConfig:
    """``model.stream``: the residual stream(s) the blocks read and write (registry ``STREAMS``,
    archlab/nn/streams/). ``kind`` picks it, and its own config class, a subclass registered with
    ``stream_config`` beside its entry, holds exactly the fields it reads."""

    kind: str = "plain"


# the residual streams' config classes, filled as archlab.nn.streams is imported
# a layer kind naming another stream keeps the model's n (its layers join the model's streams)
STREAM_OPTIONS = Options("stream", "residual stream", StreamConfig, keep_shared=True)
stream_config = STREAM_OPTIONS.register  # @stream_config(kind): the decorated class is stream kind's config
# the sections whose options own their configs
OPTIONS = {"attention": MIXER_OPTIONS, "position": POSITION_OPTIONS, "mlp": MLP_OPTIONS, "stream": STREAM_OPTIONS}


@dataclass
class MTPConfig:
    """``model.head.mtp``: multi-token prediction (DeepSeek-V3, arXiv:2412.19437 §2.2; archlab/nn/mtp.py):
    ``depth`` modules after the model, module k predicting the token k + 1 after each position from module
    k − 1's state and the next token's embedding, through the shared embedding and head; trained with
    ``weight`` times the mean of their losses beside the next-token loss."""

    depth: int = 0  # D, the extra tokens predicted (0: none; DeepSeek-V3, Qwen3-Next: 1)
    weight: float = 0.3  # λ: loss = next-token + λ·mean_k(CE_k) (DeepSeek-V3: 0.3, then 0.1)
    layer: Optional[str] = None  # each module's block: a kind of model.layers.kinds; null: the model's own parts


@dataclass
class HeadConfig:
    """``model.head``: the output projection to the vocabulary (``HEADS``, archlab/nn/head.py)."""

    kind: str = (
        "linear"  # linear (a matrix of its own, or the token embedding when tied) | transform (dense, act, norm first)
        # | ngpt (linear's, times a learned s_z per vocabulary entry)
    )
    tied: bool = True
    bias: bool = False
    softcap: Optional[float] = None  # logits -> softcap·tanh(logits/softcap) (Gemma 2: 30)
    logit_scale: float = 1.0  # logits times this, then any softcap (Cohere: logit_scale; Granite: 1/logits_scaling)
    # the head's rows: logits for ids 0..vocab-1 alone (Apertus 1.5's output_vocab_size: the text ids of a larger
    # input vocabulary); null = model.vocab_size. Untied only
    vocab: Optional[int] = None
    # transform only: the state through a dense e × e (a bias with transform_bias), this activation and a norm of
    # model.norm's kind before the vocabulary matrix (ModernBERT's prediction head, BERT's transform)
    transform_activation: str = choice("gelu", "gelu_tanh", "relu", "silu")
    transform_bias: bool = False
    # ngpt only: the logits times a learned s_z per vocabulary entry, starting at scale_init, stored as
    # s_z·scale_scale/scale_init (nGPT's scaled parameter; None = 1/sqrt(d_model))
    scale_init: float = 1.0
    scale_scale: Optional[float] = None
    mtp: MTPConfig = field(default_factory=MTPConfig)  # multi-token prediction modules (archlab/nn/mtp.py)


@dataclass
class PerLayerInputConfig:
    """``model.per_layer_input``: per-layer input embeddings (Gemma 3n and 4's PLE; archlab/nn/per_layer_inputs.py):
    every layer i reads a ``dim``-wide input of its own, a table's row for the token (times sqrt(dim)) plus the
    normed projection of the token embedding (times d_model^-1/2), both times 2^-1/2; after its sublayers the
    layer adds norm(up(act(gate(x)) · input_i)) to the stream."""

    dim: int = 0  # p, each layer's input width (Gemma 4 E2B: 256); 0 = none
    vocab: Optional[int] = None  # the table's rows; None = model.vocab_size
    activation: str = choice("gelu_tanh", "gelu", "silu", "relu")  # act of the gate (Gemma: its MLP's, gelu_tanh)


@dataclass
class LinearConfig:
    """``model.linear``: the layers' attention and MLP projections (archlab/nn/bitlinear.py): dense, or BitNet
    b1.58's BitLinear (Ma et al. 2024), weights ternary by their absmean and activations int8 per token by
    their absmax; embeddings, head and norms stay full precision."""

    kind: str = choice("dense", "bitlinear")
    # bitlinear: online, the weights held full precision and quantised at each forward (training, through the
    # straight-through estimator); offline, held ternary with a weight_scale per projection (a packed checkpoint)
    weights: str = choice("online", "offline")


@dataclass
class NGramInputConfig:
    """``model.ngram_input``: hashed n-gram inputs (Qwen4-Exp's PLE; archlab/nn/ngram_input.py): before each
    of ``layers``, the block's streams gain σ(their match with keys of the tokens' n-gram embeddings) times a
    value of them, plus a dilated causal convolution of that over the positions."""

    layers: list[int] = field(default_factory=list)  # the layers (from 0) that have one; [] = none (ple_layer_ids − 1)
    dim: Optional[int] = None  # the n-gram embeddings' width, all heads concatenated; None = d_model (ple_embed_dim)
    conv_kernel: int = 4  # the convolution's taps, dilated by ``order`` (ple_conv_kernel_size)
    order: int = 3  # the longest n-gram (ngram_size)
    heads: int = 8  # hashed tables per order (heads_per_ngram)
    table_base: int = 20_000_000  # the first prime a slice's rows may be (ngram_vocab_size_base)
    table_multiple: int = 128  # a table's rows rounded up to a multiple of this (make_ngram_vocab_size_divisible_by)
    seed: int = 1234  # seeds the hash multipliers (seed)
    boundary: Optional[int] = None  # the token that ends a document (the eos id); n-grams do not cross it


@dataclass
class LoopConfig:
    """``model.layers.loop``: layers ``start`` to ``end`` (``end`` excluded) run ``passes`` times in all, pass
    after pass, with one set of weights (``archlab.config.loop``: the looped block of Universal Transformers,
    Huginn, Ouro); 1 pass is no loop."""

    start: int = 0  # the first looped layer
    end: Optional[int] = None  # the layer after the last looped one; None = model.n_layer
    passes: int = 1  # how many times the looped layers run in all (Inkling2Loop's loop_num_passes)
    # each pass starts from norm(h) + norm(e), e the state entering the looped layers (Dory's input injection;
    # its norms the model's norm kind, which must hold no weights: model.norm.kind=l2 or affine false)
    inject: bool = False


@dataclass
class SharedConfig:
    """``model.layers.shared``: weight-shared transformer blocks (Zamba's) run before the ``layers`` listed,
    ``blocks`` of them in turn; each use reads [the layer's input, the embeddings] (2·d_model, normed), attends
    with heads of 2·d_model/``n_head`` scaled as those of d_model/``n_head``, projects to d_model, runs a gated
    MLP, and adds its own linear's output to that layer's input before the layer's norm (``archlab.nn.shared``).
    Each use has its own low-rank adapters on the MLP's gate/up (and with ``attention_adapters``, on q, k, v)."""

    layers: List[int] = field(default_factory=list)  # the layers a use precedes (Zamba2's hybrid_layer_ids); [] none
    blocks: int = 1  # distinct shared blocks, used round-robin (num_mem_blocks)
    n_head: int = 8  # the shared attention's query heads, each 2·d_model/n_head wide
    n_kv_head: Optional[int] = None  # its key/value heads; None = n_head
    d_ff: Optional[int] = None  # the MLP's hidden width; None = 4·d_model
    activation: str = choice("gelu", "gelu_tanh", "silu", "relu")  # the MLP's gate: act(gate)·up
    mlp_bias: bool = False  # biases on the MLP's gate/up and down projections (add_bias_linear)
    adapter_rank: int = 0  # rank of each use's adapters (adapter_rank); 0 none
    attention_adapters: bool = False  # q, k, v adapters per use too (use_shared_attention_adapter)
    rope: bool = False  # RoPE on the shared attention's whole heads (use_mem_rope)
    rope_theta: float = 10000.0


@dataclass
class LayersConfig:
    """``model.layers``: layers that differ (``archlab.config.layers``). Named kinds, each overriding fields
    of the model's ``attention``, ``position``, ``mlp``, ``block`` and ``stream``, and the layers each kind is
    given: the first ones by ``first``, the rest by ``pattern`` cycled; a layer given no kind has the model's own parts.
    ``loop``: a range of layers run again, with the same weights; ``shared``: weight-shared blocks feeding layers."""

    kinds: Any = None  # name -> {attention: {window: 512}, position: {kind: none}} (untyped: set from the command line)
    first: List[str] = field(default_factory=list)  # the kinds of layers 0, 1, ..., len(first) - 1 ([dense]: DeepSeek)
    pattern: List[str] = field(default_factory=list)  # the kinds of the layers after them, cycled ([local, global])
    loop: LoopConfig = field(default_factory=LoopConfig)
    shared: SharedConfig = field(default_factory=SharedConfig)


@dataclass
class ModelConfig:
    """``model``: a whole decoder; every field a preset in conf/model may set."""

    vocab_size: int = 50257
    context_length: int = 1024
    n_layer: int = 12
    d_model: int = 768
    dropout: float = 0.0  # each sublayer's output, and the embeddings while embedding_dropout is None
    # the embeddings' dropout, before the first block (GPT-2's embd_pdrop; OPT, BLOOM, Phi-3: 0.0); None = dropout
    embedding_dropout: Optional[float] = None
    init_std: float = 0.02
    # the depth the residual output projections' init counts, std × 1/sqrt(2·this): None = n_layer (GPT-2); a
    # fixed number keeps their init from shrinking as layers are added (μP with no depth rule, as nanoGPT-mup)
    residual_init_depth: Optional[int] = None
    # the token and position tables' init std (μP's input layer: Θ(1) coordinates, e.g. 1.0); None = init_std
    embedding_init_std: Optional[float] = None
    scale_embedding: bool = False  # multiply the token embeddings by sqrt(d_model) (Gemma)
    embedding_norm: bool = False  # a norm of model.norm's kind on the token embeddings, before the blocks (BLOOM)
    embedding_multiplier: float = 1.0  # token embeddings times this (Granite); 1.0 while scale_embedding is true
    # token embeddings (and a tied head) of this width, projected in to d_model before the blocks and out of it
    # before the head, bias-free (OPT-350m's word_embed_proj_dim); None = d_model, no projections
    embedding_dim: Optional[int] = None
    norm: NormConfig = field(default_factory=NormConfig)
    block: BlockConfig = field(default_factory=BlockConfig)
    # a PositionConfig: the chosen scheme's own class
    position: Any = field(default_factory=lambda: POSITION_OPTIONS.classes["learned"]())
    # a MixerConfig: the chosen mixer's own class (typed Any: each mixer's fields are read through its own class)
    attention: Any = field(default_factory=lambda: MIXER_OPTIONS.classes["causal"]())
    mlp: Any = field(default_factory=lambda: MLP_OPTIONS.classes["gelu"]())  # an MLPConfig: the chosen MLP's own class
    # a StreamConfig: the chosen residual stream's own class (plain: one stream, x + sublayer(x))
    stream: Any = field(default_factory=lambda: STREAM_OPTIONS.classes["plain"]())
    head: HeadConfig = field(default_factory=HeadConfig)
    layers: LayersConfig = field(default_factory=LayersConfig)
    per_layer_input: PerLayerInputConfig = field(default_factory=PerLayerInputConfig)
    linear: LinearConfig = field(default_factory=LinearConfig)
    ngram_input: NGramInputConfig = field(default_factory=NGramInputConfig)


def to_model_config(cfg: Any) -> ModelConfig:
    """Accept a ModelConfig, a DictConfig/dict of one, or a composed config with a ``model`` key. The mixer
    and the MLP are built by their kind's own classes (``OPTIONS``): a field the option lacks is refused,
    except in a section Hydra composed (``Options.schema``), where a preset's fields for another option
    are left out (``left_out`` names them)."""
    if isinstance(cfg, ModelConfig):
        return cfg
    if isinstance(cfg, DictConfig):
        if "model" in cfg and "n_layer" not in cfg:
            cfg = cfg.model
        composed = any(section in cfg and o.composed(cfg[section]) for section, o in OPTIONS.items())
        data = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False))
        if composed:
            data = _kept(data)[0]
        return to_model_config(data)
    if isinstance(cfg, dict):
        data = dict(cfg)
        sections = {section: data.pop(section, None) or {} for section in OPTIONS}
        merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), data)
        # to_object of a config merged onto the ModelConfig schema instantiates that dataclass
        out = cast(ModelConfig, OmegaConf.to_object(merged))
        for section, options in OPTIONS.items():  # type-checked and converted as Hydra does (OmegaConf)
            setattr(out, section, options.typed(sections[section], f"model.{section}"))
        return out
    raise TypeError(f"expected a ModelConfig, DictConfig or dict, got {type(cfg).__name__}")


def _kinds_sections(
    model: dict[str, Any], section: str, mapped: Callable[[str, dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """``model`` with each layer kind's ``section`` replaced by ``mapped(its name, section)``."""
    layers = dict(model.get("layers") or {})
    kinds = layers.get("kinds")
    if not isinstance(kinds, dict):
        return model
    kinds = {
        name: {**o, section: mapped(name, o[section])}
        if isinstance(o, dict) and isinstance(o.get(section), dict)
        else o
        for name, o in kinds.items()
    }
    return {**model, "layers": {**layers, "kinds": kinds}}


def _kept(model: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, Any, str]]]:
    """A composed model dict with only the fields each option has, in the model's sections and each layer
    kind's (a kind of the model's option, or its own), and the others left out: (field, value, option)."""
    out: list[tuple[str, Any, str]] = []
    for section, options in OPTIONS.items():
        values = model.get(section) or {}
        kind = values.get("kind", options.base.kind)
        kept, dropped = options.split(values, kind)
        out += _dropped(options, f"model.{section}", kind, dropped)
        model = _kinds_sections({**model, section: kept}, section, _kind_kept(options, section, kind, out))
    return model, out


def _kind_kept(
    options: Options, section: str, kind: str, out: list[tuple[str, Any, str]]
) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    """A layer kind's ``section`` as ``_kept`` keeps it (its option: its own kind, else the model's
    ``kind``), what it leaves out added to ``out``."""

    def kept(name: str, values: dict[str, Any]) -> dict[str, Any]:
        option = values.get("kind", kind)
        kept_here, other = options.split(values, option)
        out.extend(_dropped(options, f"model.layers.kinds.{name}.{section}", option, other))
        return kept_here

    return kept


def _dropped(options: Options, where: str, kind: str, dropped: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """(field, value, option) of each field ``dropped`` sets (a sub-config's: each of its own)."""
    return [
        (f"{where}.{f}", v, f"{options.noun} {kind}")
        for name, value in dropped.items()
        for f, v in options.set_fields(name, value)
    ]


def left_out(cfg: Any) -> list[str]:
    """The mixer and MLP fields a composed config (a DictConfig of a model, or with a ``model`` key) sets
    that the option they would reach does not have (a preset's fields for the option another replaced, a
    layout's for a mixer it no longer has, a sweep's for another option), each as a line saying so; []
    for any other input."""
    if not isinstance(cfg, DictConfig):
        return []
    if "model" in cfg and "n_layer" not in cfg:
        cfg = cfg.model
    if not any(section in cfg and o.composed(cfg[section]) for section, o in OPTIONS.items()):
        return []
    data = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False))
    return [f"{path}={value!r} is left out: {option} has no such field" for path, value, option in _kept(data)[1]]


def shortest_layout(names: list[str]) -> tuple[list[str], list[str]]:
    """The shortest ``first`` + ``pattern`` (cycled) that gives layer i the kind ``names[i]``; among equally
    short ones the shorter ``first`` (a layout that never repeats is all ``pattern``)."""
    n, best = len(names), ([], list(names))
    for p in range(n):
        rest = names[p:]
        q = next(q for q in range(1, len(rest) + 1) if all(rest[j] == rest[j % q] for j in range(len(rest))))
        if p + q < len(best[0]) + len(best[1]):
            best = (names[:p], rest[:q])
    return best


# Earlier versions' two per-layer fields, now layer kinds: (section, field, its value when unset)
_LEGACY = (("attention", "global_every", None), ("mlp", "dense_layers", 0))


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name`` with the first number from 2 that no kind in ``taken`` has."""
    out, n = name, 2
    while out in taken:
        out, n = f"{name}{n}", n + 1
    return out


def legacy_layers(model: dict[str, Any]) -> dict[str, Any]:
    """A recorded model dict's ``attention.global_every`` and ``mlp.dense_layers`` (earlier versions' two
    per-layer fields, on the model's sections or a layer kind's) as the ``model.layers`` layout that gives
    every layer the parts it had: layer i was global where its window was set and (i + 1) % global_every
    == 0, and held one dense ``expert`` MLP where its MLP was a moe and i < dense_layers. Such a layer's
    kind is its earlier kind (if any) joined with ``global`` and/or ``dense``, overriding ``window: null``
    and ``mlp.kind: <expert>``; the layers left without a kind keep the model's own parts, as a trailing
    run or, within a cycle, as the empty kind ``local`` (``moe`` where only the MLP varies). Gemma 2's
    window + global_every 2 reads as pattern [local, global]; DeepSeek-V3's dense_layers 3 as first
    [dense, dense, dense]: what the presets now write, so a resumed run's config compares equal."""
    sections = {key: dict(model.get(key) or {}) for key in ("attention", "mlp")}
    layers = dict(model.get("layers") or {})
    kinds = layers.get("kinds") or {}
    if not isinstance(kinds, dict) or any(not isinstance(o, dict) for o in kinds.values()):
        kinds = {}  # not a layout this can read: the schema refuses it after the legacy fields go
    kinds = {str(name): {k: dict(v) if isinstance(v, dict) else v for k, v in o.items()} for name, o in kinds.items()}
    legacy = [(s, f) for s, f, unset in _LEGACY if sections[s].get(f, unset) != unset]
    legacy += [(s, f) for o in kinds.values() for s, f, _ in _LEGACY if isinstance(o.get(s), dict) and f in o[s]]
    if not legacy:  # absent, or at the value that meant every layer alike (null, 0): the keys go
        for section, key, _ in _LEGACY:
            sections[section].pop(key, None)
        return {**model, **{k: v for k, v in sections.items() if k in model}}
    first, pattern = list(layers.get("first") or []), list(layers.get("pattern") or [])
    n = model.get("n_layer", ModelConfig.n_layer)
    if any(k not in kinds for k in first + pattern) or len(first) > n:
        raise ConfigError(
            "model.layers",
            layers,
            "a layout whose first and pattern name defined kinds, to read global_every "
            "and dense_layers (fields of an earlier version) into",
        )
    defaults = {"attention": MixerConfig(), "mlp": MLPConfig()}  # window, global_every: None unless set

    def value(overrides: dict[str, Any], section: str, key: str) -> Any:
        own = overrides.get(section)
        if isinstance(own, dict) and key in own:
            return own[key]
        return sections[section].get(key, getattr(defaults[section], key, None))

    old = [
        first[i] if i < len(first) else (pattern[(i - len(first)) % len(pattern)] if pattern else None)
        for i in range(n)
    ]
    taken = set(kinds)
    names: list[Optional[str]] = []
    new_kinds: dict[str, Any] = {}
    renamed: dict[tuple[Optional[str], bool, bool], str] = {}
    for i, kind in enumerate(old):
        overrides = kinds.get(kind, {}) if kind is not None else {}
        window, every = value(overrides, "attention", "window"), value(overrides, "attention", "global_every")
        is_global = window is not None and every is not None and (i + 1) % every == 0
        is_dense = value(overrides, "mlp", "kind") == "moe" and i < (value(overrides, "mlp", "dense_layers") or 0)
        if not (is_global or is_dense):
            names.append(kind)
            continue
        key = (kind, is_global, is_dense)
        if key not in renamed:
            tags = ([kind] if kind is not None else []) + ["global"] * is_global + ["dense"] * is_dense
            renamed[key] = name = _unique("_".join(tags), taken)
            taken.add(name)
            parts = {s: dict(v) if isinstance(v, dict) else v for s, v in overrides.items()}
            if is_global:
                parts["attention"] = {**(parts.get("attention") or {}), "window": None}
            if is_dense:
                parts["mlp"] = {**(parts.get("mlp") or {}), "kind": value(overrides, "mlp", "expert")}
            new_kinds[name] = parts
        names.append(renamed[key])
    kept = {k: v for k, v in kinds.items() if k in names or k not in old}  # an unused kind stays unused
    new_kinds = {**kept, **new_kinds}
    for overrides in new_kinds.values():  # the legacy fields leave every kind
        for section, key, _ in _LEGACY:
            if isinstance(overrides.get(section), dict):
                overrides[section].pop(key, None)
                if not overrides[section]:
                    del overrides[section]
    bare = [i for i, k in enumerate(names) if k is None]
    if not renamed:  # the fields changed no layer (no window, or no moe): the layout stays as it was
        names, bare = [], []
    if bare and bare != list(range(bare[0], n)):  # layers of the model's own parts within a cycle: a kind
        plain = _unique("local" if any(g for _, g, _ in renamed) else "moe", taken)
        new_kinds[plain] = {}
        names = [plain if k is None else k for k in names]
        bare = []
    named = [cast(str, k) for k in names[: bare[0] if bare else n]]
    if renamed:
        first, pattern = (named, []) if bare else shortest_layout(named)
    for section, key, _ in _LEGACY:
        sections[section].pop(key, None)
    layers.update(kinds=new_kinds or None, first=first, pattern=pattern)
    return {**model, **sections, "layers": layers}


def flat_mixers(model: dict[str, Any]) -> dict[str, Any]:
    """A model dict recorded when ``model.attention`` was one flat section of every mixer's fields (each
    mixer reading its own, a layer kind's fields merged into the model's whatever its mixer) as today's
    per-mixer configs, describing the same model: the model's mixer keeps its own fields, and a layer kind
    whose mixer differs from the model's gets every field of its mixer written out, from the model's
    section with the kind's own over it (what it inherited then). A record of today's form (no field
    foreign to its mixer) is returned as it is."""
    attention = model.get("attention")
    if not isinstance(attention, dict):
        return model
    kind = attention.get("kind", MixerConfig.kind)
    if kind not in MIXER_OPTIONS.classes or set(attention) <= set(MIXER_OPTIONS.fields(kind)):
        return model

    def written_out(_name: str, section: dict[str, Any]) -> dict[str, Any]:
        merged = {**attention, **section}  # what the kind's layers had: the model's section, its own over it
        mixer = merged.get("kind", kind)
        return MIXER_OPTIONS.own_fields(section if mixer == kind else merged, mixer)

    return _kinds_sections({**model, "attention": MIXER_OPTIONS.own_fields(attention, kind)}, "attention", written_out)


def flat_sections(model: dict[str, Any]) -> dict[str, Any]:
    """A model dict recorded when ``model.mlp`` and ``model.position`` were each one flat section of every
    option's fields as today's per-option configs, describing the same model: in the model's section and
    each layer kind's, a sub-config's fields (a mixture of experts' ``routing``, RoPE's ``scaling``)
    gathered under its name and the fields the option lacks, which it never read, dropped. A record of
    today's form is returned as it is."""
    for section in ("position", "mlp"):
        values = model.get(section)
        if not isinstance(values, dict):
            continue
        options = OPTIONS[section]
        kind = values.get("kind", options.base.kind)

        def own(_name: str, part: dict[str, Any], options: Options = options, kind: str = kind) -> dict[str, Any]:
            return options.recorded(part, part.get("kind", kind))

        model = _kinds_sections({**model, section: options.recorded(values, kind)}, section, own)
    return model


def recorded_model_config(recorded: Any) -> ModelConfig:
    """A model config as an earlier archlab recorded it (in a checkpoint or an export), read under today's
    schema without changing the model it describes: fields added since take their defaults, which are
    the earlier behaviour; ``global_every`` and ``dense_layers`` read as the layer kinds that replaced them
    (``legacy_layers``); and one flat attention, position or MLP section as per-option configs
    (``flat_mixers``, ``flat_sections``)."""
    if isinstance(recorded, DictConfig):
        recorded = OmegaConf.to_container(recorded, resolve=True)
    if isinstance(recorded, dict):
        recorded = cast(dict[str, Any], recorded)
        if "model" in recorded and "n_layer" not in recorded:
            recorded = recorded["model"]
        recorded = flat_sections(flat_mixers(legacy_layers(recorded)))
    return to_model_config(recorded)


def with_fields(cfg: ModelConfig, values: dict[str, Any], where: str) -> ModelConfig:
    """``cfg`` with ``values`` (model fields, ``where`` naming them in an error) set: a mixer or MLP section
    naming another option swaps it whole, as a layer kind does (``Options.build``); other sections merged."""
    values = dict(values)
    sections = {
        section: OPTIONS[section].build(dict(values.pop(section)), f"{where}.{section}", base=getattr(cfg, section))
        for section in list(values)
        if section in OPTIONS
    }
    rest = {k: v for k, v in model_config_dict(cfg).items() if k not in OPTIONS}
    merged = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.merge(rest, values)))
    own = {section: sections.get(section, getattr(cfg, section)) for section in OPTIONS}
    return to_model_config({**merged, **own})


def model_config_dict(cfg: ModelConfig) -> dict[str, Any]:
    """The config as plain containers (for checkpoints, safetensors metadata and summaries)."""
    return plain_dict(OmegaConf.structured(cfg))


# ---- resolved sizes: the config's defaults spelled out, shared by the modules and the formulas ----
# (sizes that depend on the variant, such as the head size, are its entry's answers: archlab.nn.mixers.base)


def embedding_dropout(cfg: ModelConfig) -> float:
    """The dropout rate on the embeddings entering the first block: ``embedding_dropout``, else ``dropout``."""
    return cfg.dropout if cfg.embedding_dropout is None else cfg.embedding_dropout


def n_kv_head(cfg: ModelConfig) -> int:
    """Key/value heads: ``attention.n_kv_head``, else ``n_head`` (MHA)."""
    a = cfg.attention
    return a.n_kv_head if a.n_kv_head is not None else a.n_head
