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


@dataclass
class NormConfig:
    """``model.norm``: the normalisation layer (registry ``NORMS``, archlab/nn/norms.py)."""

    kind: str = "layernorm"  # layernorm | rmsnorm
    eps: float = 1e-5
    bias: bool = True  # layernorm only
    unit_offset: bool = False  # rmsnorm: the scale is stored as w and applied as (1 + w), w starting at 0 (Gemma)


@dataclass
class BlockConfig:
    """``model.block``: how a block wires attention and MLP into the residual stream (``BLOCKS``, archlab/nn/block.py)."""

    kind: str = "pre"  # pre | post | parallel | post_sublayer | sandwich
    shared_norm: bool = True  # parallel only: one norm feeds attention and MLP (GPT-J)


@dataclass
class PositionConfig:
    """``model.position``: the position scheme (``POSITIONS``, archlab/nn/positions.py; rope: archlab/nn/rope.py)."""

    kind: str = "learned"  # learned | sinusoidal | rope | alibi | none
    theta: float = 10000.0  # rope base
    rotary_dim: Optional[int] = None  # rope: rotate only this many dims of each head
    rotary_fraction: Optional[float] = None  # rope: ... or this fraction of them
    pairing: str = choice("half", "interleaved")  # rope: half (rotate_half, LLaMA/NeoX) | interleaved (GPT-J)
    scaling: str = choice("none", "linear", "llama3", "yarn")  # rope: frequency scaling for a longer context
    factor: float = 1.0  # rope scaling: how much longer the context is (Llama 3.1: 8, DeepSeek-V3: 40)
    low_freq_factor: float = 1.0  # llama3 scaling: wavelengths above original_context / this are divided by factor
    high_freq_factor: float = 4.0  # llama3 scaling: wavelengths below original_context / this are kept
    original_context: Optional[int] = None  # llama3, yarn: the context length before scaling (Llama 3.1: 8192)
    beta_fast: float = 32.0  # yarn: pairs turning more than this often over original_context keep their frequency
    beta_slow: float = 1.0  # yarn: pairs turning less than this often are interpolated by factor; a ramp between
    truncate: bool = True  # yarn: the ramp's ends rounded outward to whole pairs (transformers' truncate)
    mscale: Optional[float] = None  # yarn: cos/sin scaled by mscale(factor, mscale) / mscale(factor, mscale_all_dim)
    mscale_all_dim: Optional[float] = None  # yarn: the softmax scale times mscale(factor, this)^2 (DeepSeek)


@dataclass
class AttentionConfig:
    """``model.attention``: self-attention, its heads and projections (``ATTENTIONS``, archlab/nn/attention.py)."""

    kind: str = "causal"  # causal (softmax attention over the past, MHA/GQA/MQA by n_kv_head) | mla (latent)
    n_head: int = 12
    n_kv_head: Optional[int] = None  # None = n_head (MHA); divides n_head (GQA); 1 (MQA)
    head_dim: Optional[int] = None  # None = d_model // n_head
    qkv_bias: bool = True
    out_bias: bool = True
    dropout: float = 0.0
    qk_norm: str = choice(
        "none", "head", "full", "l2"
    )  # norm q and k before RoPE: per head (Qwen3) | whole projection (OLMo 2); after RoPE: l2, per head, no weight (Llama 4)
    scale: Optional[float] = None  # score multiplier; None = 1/sqrt(head_dim) (Gemma 2: query_pre_attn_scalar^-0.5)
    softcap: Optional[float] = None  # scores -> softcap·tanh(scores/softcap) (Gemma 2: 50)
    window: Optional[int] = None  # sliding window: a query sees itself and the window-1 positions before it (Mistral)
    global_every: Optional[int] = None  # with window: every N-th layer is global (Gemma 2: 2); None = all local
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
    # mla, multi-head latent attention (DeepSeek-V2): keys and values from a low-rank latent the cache stores
    q_lora_rank: Optional[int] = None  # mla: queries through a rank-r bottleneck (DeepSeek-V3: 1536); None = direct
    kv_lora_rank: int = 512  # mla: width of the compressed key/value latent
    qk_nope_head_dim: int = 128  # mla: query/key dims per head that carry no position
    qk_rope_head_dim: int = 64  # mla: rotated query dims per head, and the one rotated key all heads share
    v_head_dim: int = 128  # mla: value dims per head


@dataclass
class MLPConfig:
    """``model.mlp``: the feed-forward layer and its hidden width (``MLPS``, archlab/nn/mlp.py)."""

    kind: str = "gelu"  # gelu | relu | swiglu | geglu | moe (a mixture of experts of kind ``expert``)
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
    expert: str = choice("swiglu", "geglu", "gelu", "relu")  # moe: the kind of every expert (and dense layer)
    n_experts: int = 8  # moe: routed experts per layer
    top_k: int = 2  # moe: routed experts each token goes through
    expert_d_ff: Optional[int] = None  # moe: a routed expert's hidden width; None = the d_ff rules above
    n_shared_experts: int = 0  # moe: experts every token goes through, as one MLP of n·expert_d_ff (DeepSeek)
    dense_layers: int = 0  # moe: the first N layers hold one dense ``expert`` MLP of width d_ff (DeepSeek)
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
    dropout: float = 0.0  # embedding and residual dropout
    init_std: float = 0.02
    scale_embedding: bool = False  # multiply the token embeddings by sqrt(d_model) (Gemma)
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


def recorded_model_config(recorded: Any) -> ModelConfig:
    """A model config as an earlier archlab recorded it (in a checkpoint or an export), read under today's
    schema without changing the model it describes: fields added since take their defaults, which are
    the earlier behaviour, and ``approximate``, which swiglu and relu then ignored, reads as none there."""
    cfg = to_model_config(recorded)
    if cfg.mlp.kind in ("swiglu", "relu"):
        cfg.mlp.approximate = "none"
    return cfg


def model_config_dict(cfg: ModelConfig) -> dict[str, Any]:
    """The config as plain containers (for checkpoints, safetensors metadata and summaries)."""
    return plain_dict(OmegaConf.structured(cfg))


# ---- resolved sizes: the config's defaults spelled out, shared by the modules and the formulas ----
# (sizes that depend on the variant, such as the head size, are its entry's answers: archlab.nn.attention)


def n_kv_head(cfg: ModelConfig) -> int:
    """Key/value heads: ``attention.n_kv_head``, else ``n_head`` (MHA)."""
    a = cfg.attention
    return a.n_kv_head if a.n_kv_head is not None else a.n_head
