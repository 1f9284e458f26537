"""Structured model configs: the contract every registry family reads (plain dataclasses; Hydra's
ConfigStore holds them, see ``archlab.config.store``).

One dataclass per registry family holds the fields of every variant of that family; ``kind`` picks
the variant and the variant's own entry checks the fields it uses (see ``archlab.nn``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, cast

from omegaconf import DictConfig, OmegaConf

from archlab.config.fields import choice, plain_dict
from archlab.errors import ConfigError


@dataclass
class NormConfig:
    """``model.norm``: the normalisation layer (registry ``NORMS``, archlab/nn/norms.py)."""

    kind: str = "layernorm"  # layernorm | rmsnorm
    eps: float = 1e-5
    bias: bool = True  # layernorm only
    affine: bool = True  # false: no learned scale or shift, the norm alone (OLMo 1's LayerNorm); bias unread
    unit_offset: bool = False  # the scale stored as w and applied as (1 + w), w starting at 0 (Gemma, Nemotron)


@dataclass
class BlockConfig:
    """``model.block``: how a block wires attention and MLP into the residual stream (``BLOCKS``, archlab/nn/block.py)."""

    kind: str = "pre"  # pre | post | parallel | post_sublayer | sandwich
    shared_norm: bool = True  # parallel only: one norm feeds attention and MLP (GPT-J)
    residual_multiplier: float = 1.0  # each sublayer's output times this as it joins the residual stream (Granite)


@dataclass
class PositionConfig:
    """``model.position``: the position scheme (``POSITIONS``, archlab/nn/positions.py; rope: archlab/nn/rope.py)."""

    kind: str = "learned"  # learned | sinusoidal | rope | alibi | none
    theta: float = 10000.0  # rope base
    rotary_dim: Optional[int] = None  # rope: rotate only this many dims of each head
    rotary_fraction: Optional[float] = None  # rope: ... or this fraction of them
    pairing: str = choice("half", "interleaved")  # rope: half (rotate_half, LLaMA/NeoX) | interleaved (GPT-J)
    scaling: str = choice("none", "linear", "llama3", "yarn", "longrope")  # rope: frequency scaling, a longer context
    factor: float = 1.0  # rope scaling: how much longer the context is (Llama 3.1: 8, DeepSeek-V3: 40)
    low_freq_factor: float = 1.0  # llama3 scaling: wavelengths above original_context / this are divided by factor
    high_freq_factor: float = 4.0  # llama3 scaling: wavelengths below original_context / this are kept
    original_context: Optional[int] = None  # llama3, yarn, longrope: the context before scaling (Llama 3.1: 8192)
    beta_fast: float = 32.0  # yarn: pairs turning more than this often over original_context keep their frequency
    beta_slow: float = 1.0  # yarn: pairs turning less than this often are interpolated by factor; a ramp between
    truncate: bool = True  # yarn: the ramp's ends rounded outward to whole pairs (transformers' truncate)
    mscale: Optional[float] = None  # yarn: cos/sin scaled by mscale(factor, mscale) / mscale(factor, mscale_all_dim)
    mscale_all_dim: Optional[float] = None  # yarn: the softmax scale times mscale(factor, this)^2 (DeepSeek)
    softmax_mscale: bool = True  # yarn with mscale_all_dim: it scales the softmax as above; false: cos/sin alone
    short_factor: Optional[List[float]] = None  # longrope: pair i's wavelength times [i] while within original_context
    long_factor: Optional[List[float]] = None  # longrope: ... past it (each list: rotary dims / 2 numbers)
    attention_factor: Optional[float] = None  # yarn, longrope: cos and sin times this; None = derived from factor
    alibi_scale: float = 1.0  # alibi: every head's slope times this (Falcon-RW: 1/sqrt(head_dim))
    alibi_rounding: str = choice("none", "bf16")  # alibi: bf16: slope·key position in bfloat16 (Falcon-RW)


@dataclass
class AttentionConfig:
    """``model.attention``: self-attention, its heads and projections (``MIXERS``, archlab/nn/mixers/attention.py)."""

    # causal (softmax attention over the past, MHA/GQA/MQA by n_kv_head) | mla (latent) | gated_deltanet, mamba2
    # (recurrent)
    kind: str = "causal"
    n_head: int = 12
    n_kv_head: Optional[int] = None  # None = n_head (MHA); divides n_head (GQA); 1 (MQA)
    head_dim: Optional[int] = None  # None = d_model // n_head
    qkv_bias: bool = True
    out_bias: bool = True
    dropout: float = 0.0
    qk_norm: str = choice(
        "none", "head", "full", "l2"
    )  # norm q and k: per head (Qwen3) | whole projection (OLMo 2), before RoPE unless qk_norm_after_rope; l2: per
    # head, no weight, always after RoPE (Llama 4)
    qk_norm_after_rope: bool = False  # head and full: norm the rotated q and k instead (HunYuan dense)
    qk_norm_per_head_scale: bool = False  # head: a scale (and shift) per head, H·hd and KV·hd wide (Cohere, StableLM 2)
    qk_norm_bias: Optional[bool] = None  # head, full with layernorm: the QK-norms' shift; None = model.norm.bias
    clip_qkv: Optional[float] = None  # q, k and v clamped to [-c, c] as projected, before QK-norm and RoPE (OLMo: 8)
    scale: Optional[float] = None  # score multiplier; None = 1/sqrt(head_dim) (Gemma 2: query_pre_attn_scalar^-0.5)
    softcap: Optional[float] = None  # scores -> softcap·tanh(scores/softcap) (Gemma 2: 50)
    window: Optional[int] = None  # sliding window: a query sees itself and the window-1 positions before it (Mistral)
    chunk: Optional[int] = None  # chunked attention: a query sees the earlier keys of its chunk (Llama 4: 8192)
    sinks: bool = False  # a learned logit per head joins each softmax's denominator, a key with no value (gpt-oss)
    gate: str = choice(
        "none", "elementwise", "head"
    )  # output times sigmoid(W·x) before proj: per dim of each head (AFMoE, Qwen3-Next) | per head (Step-3.5)
    # queries at position p times 1 + beta·log(1 + floor((p + offset) / length)) (Llama 4's attention temperature:
    # attn_scale 0.1, floor_scale 8192, offset 1; Ministral 3: llama_4_scaling_beta, original_max_position_embeddings, 0)
    query_scale_beta: Optional[float] = None  # None = queries unscaled
    query_scale_length: int = 8192  # positions per step of the floor
    query_scale_offset: int = 0  # added to the position before the floor (Llama 4 counts from 1)
    query_scale_by: str = choice("index", "position")  # p: the cache index (Llama 4) | RoPE's position (Ministral 3)
    # mla, multi-head latent attention (DeepSeek-V2): keys and values from a low-rank latent the cache stores
    q_lora_rank: Optional[int] = None  # mla: queries through a rank-r bottleneck (DeepSeek-V3: 1536); None = direct
    kv_lora_rank: int = 512  # mla: width of the compressed key/value latent
    qk_nope_head_dim: int = 128  # mla: query/key dims per head that carry no position
    qk_rope_head_dim: int = 64  # mla: rotated query dims per head, and the one rotated key all heads share
    v_head_dim: int = 128  # mla, gated_deltanet: value dims per head
    latent_norm_eps: Optional[float] = None  # mla: eps of the q and kv latent norms; None = model.norm.eps (MiniCPM3)
    # gated_deltanet (Gated DeltaNet, Qwen3-Next's linear layers): n_head value heads, each a key_head_dim x
    # v_head_dim state read and written by the gated delta rule; q, k and v pass a short causal convolution first
    key_heads: Optional[int] = None  # gated_deltanet: query/key heads, each serving n_head/key_heads; None = n_head
    key_head_dim: int = 128  # gated_deltanet: query/key dims per head
    conv_kernel: int = 4  # gated_deltanet, mamba2: width of the causal depthwise convolution (q, k, v | x, B, C)
    scan_chunk: int = 64  # gated_deltanet, mamba2: positions per chunk of the parallel form (speed and memory only)
    # gated_deltanet init: dt_bias starts at this value (1.0: transformers' Qwen3-Next); None: softplus⁻¹ of a dt
    # drawn as mamba2's (dt_min, dt_max, dt_init_floor), as flash-linear-attention's GatedDeltaNet; init only
    dt_bias_init: Optional[float] = 1.0
    # mamba2 (Mamba-2's SSD, Dao & Gu 2024): n_head heads of head_dim channels (None: 2·d_model/n_head, expand 2),
    # each channel a state_size state decayed by exp(dt·A) and written along B, read by C; qkv_bias and out_bias
    # are the in- and out-projections' biases
    state_size: int = 128  # mamba2: state dims per channel (N), the width of B and C
    groups: int = 1  # mamba2: B/C groups, each shared by n_head/groups heads; also the gated norm's groups
    conv_bias: bool = True  # mamba2: a bias on the causal convolution
    dt_min: float = 0.001  # mamba2 init (gated_deltanet's too where dt_bias_init is None): dt log-uniform in
    dt_max: float = 0.1  # [dt_min, dt_max] (floored at dt_init_floor), dt_bias = softplus⁻¹(dt); init only
    dt_init_floor: float = 1e-4
    dt_limit_min: float = 0.0  # mamba2: dt = softplus(dt + dt_bias) clamped to [dt_limit_min, dt_limit_max]
    dt_limit_max: Optional[float] = None  # None = no upper bound (transformers' time_step_limit (0, inf))


@dataclass
class MLPConfig:
    """``model.mlp``: the feed-forward layer and its hidden width (``MLPS``, archlab/nn/mlp.py)."""

    kind: str = "gelu"  # gelu | relu | relu2 (relu(x)²) | swiglu | geglu | moe (a mixture of experts of ``expert``)
    d_ff: Optional[int] = None  # explicit hidden width wins over every rule below
    multiplier: Optional[float] = None  # hidden width = int(multiplier * d_model)
    ffn_dim_multiplier: Optional[float] = None  # gated LLaMA rule
    multiple_of: int = 1  # gated LLaMA rule: round the width up to a multiple of this
    bias: bool = True
    approximate: str = choice("none", "tanh")  # gelu and geglu: exact GELU, or its tanh approximation
    # swiglu (dense or experts): (clamp(up) + up_offset) · act(gate), act(g) = g·σ(swiglu_alpha·g) (gpt-oss: 7, 1.702, 1)
    swiglu_limit: Optional[float] = None  # swiglu: bound L: up clamped to [-L, L], the gate to <= L; None = no clamp
    # swiglu, with a limit: L bounds the gate (gpt-oss) | act(gate) (Step-3.5)
    swiglu_clamp: str = choice("gate", "activation")
    # moe, swiglu experts: the shared experts' bound; None = swiglu_limit, 0 = no clamp (Step-3.5's last layer: 16)
    shared_swiglu_limit: Optional[float] = None
    swiglu_alpha: float = 1.0  # swiglu: the gate's activation g·σ(α·g); 1 = SiLU (gpt-oss: 1.702)
    up_offset: float = 0.0  # swiglu: added to the (clamped) up projection before the product (gpt-oss: 1)
    # moe: a router sends each token to top_k of n_experts MLPs of kind ``expert``, beside any shared experts
    expert: str = choice("swiglu", "geglu", "gelu", "relu", "relu2")  # moe: the kind of every expert
    n_experts: int = 8  # moe: routed experts per layer
    top_k: int = 2  # moe: routed experts each token goes through
    expert_d_ff: Optional[int] = None  # moe: a routed expert's hidden width; None = the d_ff rules above
    n_shared_experts: int = 0  # moe: experts every token goes through, as one MLP of n·expert_d_ff (DeepSeek)
    # moe: the shared experts' output times sigmoid(w·x), one bias-free scalar per token (Qwen2-MoE, Qwen3-Next)
    shared_expert_gate: bool = False
    scoring: str = choice("softmax", "sigmoid")  # moe: router scores (DeepSeek-V3: sigmoid)
    normalize_top_k: bool = True  # moe: the top-k weights renormalised to sum to 1 (Mixtral, Qwen3-MoE)
    n_groups: int = 1  # moe: experts in this many groups; a token picks from the top_groups best (DeepSeek-V3: 8)
    top_groups: int = 1  # moe: groups a token may pick from, ranked by the sum of their two best scores (V3: 4)
    routed_scale: float = 1.0  # moe: the routed experts' weights times this (DeepSeek-V3: 2.5)
    correction_bias: bool = False  # moe: a per-expert bias added to the scores for selection only (DeepSeek-V3)
    router_bias: bool = False  # moe: the router Linear has a learned bias, added to its logits (gpt-oss)
    weight_input: bool = False  # moe: the routing weight scales an expert's input, not its output (Llama 4)
    aux_loss_weight: float = 0.0  # moe: weight of the load-balancing loss (Switch Transformer; Mixtral: 0.02)
    z_loss_weight: float = 0.0  # moe: weight of the router z-loss, mean logsumexp(logits)^2 (ST-MoE: 0.001)


@dataclass
class HeadConfig:
    """``model.head``: the output projection to the vocabulary (``HEADS``, archlab/nn/head.py)."""

    kind: str = "linear"  # linear (a matrix of its own, or the token embedding when tied)
    tied: bool = True
    bias: bool = False
    softcap: Optional[float] = None  # logits -> softcap·tanh(logits/softcap) (Gemma 2: 30)
    logit_scale: float = 1.0  # logits times this, then any softcap (Cohere: logit_scale; Granite: 1/logits_scaling)


@dataclass
class LayersConfig:
    """``model.layers``: layers that differ (``archlab.config.layers``). Named kinds, each overriding fields
    of the model's ``attention``, ``position`` and ``mlp``, and the layers each kind is given: the first
    ones by ``first``, the rest by ``pattern`` cycled; a layer given no kind has the model's own parts."""

    kinds: Any = None  # name -> {attention: {window: 512}, position: {kind: none}} (untyped: set from the command line)
    first: List[str] = field(default_factory=list)  # the kinds of layers 0, 1, ..., len(first) - 1 ([dense]: DeepSeek)
    pattern: List[str] = field(default_factory=list)  # the kinds of the layers after them, cycled ([local, global])


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
    scale_embedding: bool = False  # multiply the token embeddings by sqrt(d_model) (Gemma)
    embedding_norm: bool = False  # a norm of model.norm's kind on the token embeddings, before the blocks (BLOOM)
    embedding_multiplier: float = 1.0  # token embeddings times this (Granite); 1.0 while scale_embedding is true
    # token embeddings (and a tied head) of this width, projected in to d_model before the blocks and out of it
    # before the head, bias-free (OPT-350m's word_embed_proj_dim); None = d_model, no projections
    embedding_dim: Optional[int] = None
    norm: NormConfig = field(default_factory=NormConfig)
    block: BlockConfig = field(default_factory=BlockConfig)
    position: PositionConfig = field(default_factory=PositionConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    mlp: MLPConfig = field(default_factory=MLPConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    layers: LayersConfig = field(default_factory=LayersConfig)


def to_model_config(cfg: Any) -> ModelConfig:
    """Accept a ModelConfig, a DictConfig/dict of one, or a composed config with a ``model`` key."""
    if isinstance(cfg, ModelConfig):
        return cfg
    if isinstance(cfg, DictConfig):
        if "model" in cfg and "n_layer" not in cfg:
            cfg = cfg.model
        merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg)
        # to_object of a config merged onto the ModelConfig schema instantiates that dataclass
        return cast(ModelConfig, OmegaConf.to_object(merged))
    if isinstance(cfg, dict):
        return to_model_config(OmegaConf.create(cfg))
    raise TypeError(f"expected a ModelConfig, DictConfig or dict, got {type(cfg).__name__}")


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
    defaults = {"attention": AttentionConfig(), "mlp": MLPConfig()}

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


def recorded_model_config(recorded: Any) -> ModelConfig:
    """A model config as an earlier archlab recorded it (in a checkpoint or an export), read under today's
    schema without changing the model it describes: fields added since take their defaults, which are
    the earlier behaviour; ``approximate``, which swiglu and relu then ignored, reads as none there; and
    ``global_every`` and ``dense_layers`` read as the layer kinds that replaced them (``legacy_layers``)."""
    if isinstance(recorded, DictConfig):
        recorded = OmegaConf.to_container(recorded, resolve=True)
    if isinstance(recorded, dict):
        recorded = cast(dict[str, Any], recorded)
        if "model" in recorded and "n_layer" not in recorded:
            recorded = recorded["model"]
        recorded = legacy_layers(recorded)
    cfg = to_model_config(recorded)
    if cfg.mlp.kind in ("swiglu", "relu"):
        cfg.mlp.approximate = "none"
    return cfg


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
