"""Structured model configs (the config contract every registry family reads), registered in Hydra's ConfigStore.

One dataclass per registry family holds the fields of every variant of that family; ``kind`` picks
the variant and the variant's own entry checks the fields it uses (see ``archlab.nn``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from archlab.errors import ConfigError


@dataclass
class NormConfig:
    """``model.norm``: the normalisation layer (registry ``NORMS``, archlab/nn/norms.py)."""

    kind: str = "layernorm"  # layernorm | rmsnorm
    eps: float = 1e-5
    bias: bool = True  # layernorm only


@dataclass
class BlockConfig:
    """``model.block``: how a block wires attention and MLP into the residual stream (``BLOCKS``, archlab/nn/block.py)."""

    kind: str = "pre"  # pre | post | parallel
    shared_norm: bool = True  # parallel only: one norm feeds attention and MLP (GPT-J)


@dataclass
class PositionConfig:
    """``model.position``: the position scheme (``POSITIONS``, archlab/nn/positions.py)."""

    kind: str = "learned"  # learned | sinusoidal | rope | alibi | none
    theta: float = 10000.0  # rope base
    rotary_dim: Optional[int] = None  # rope: rotate only this many dims of each head
    rotary_fraction: Optional[float] = None  # rope: ... or this fraction of them
    pairing: str = "half"  # rope: half (rotate_half, LLaMA/NeoX) | interleaved (GPT-J)


@dataclass
class AttentionConfig:
    """``model.attention``: heads and projections of causal self-attention (archlab/nn/attention.py)."""

    n_head: int = 12
    n_kv_head: Optional[int] = None  # None = n_head (MHA); divides n_head (GQA); 1 (MQA)
    head_dim: Optional[int] = None  # None = d_model // n_head
    qkv_bias: bool = True
    out_bias: bool = True
    dropout: float = 0.0


@dataclass
class MLPConfig:
    """``model.mlp``: the feed-forward layer and its hidden width (``MLPS``, archlab/nn/mlp.py)."""

    kind: str = "gelu"  # gelu | relu | swiglu | geglu
    d_ff: Optional[int] = None  # explicit hidden width wins over every rule below
    multiplier: Optional[float] = None  # hidden width = int(multiplier * d_model)
    ffn_dim_multiplier: Optional[float] = None  # gated LLaMA rule
    multiple_of: int = 1  # gated LLaMA rule: round the width up to a multiple of this
    bias: bool = True
    approximate: str = "none"  # gelu only: none | tanh


@dataclass
class HeadConfig:
    """``model.head``: the output projection to the vocabulary (archlab/nn/model.py)."""

    tied: bool = True
    bias: bool = False


@dataclass
class ModelConfig:
    """``model``: a whole decoder; every field a preset in archlab/conf/model may set."""

    vocab_size: int = 50257
    context_length: int = 1024
    n_layer: int = 12
    d_model: int = 768
    dropout: float = 0.0  # embedding and residual dropout
    init_std: float = 0.02
    norm: NormConfig = field(default_factory=NormConfig)
    block: BlockConfig = field(default_factory=BlockConfig)
    position: PositionConfig = field(default_factory=PositionConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    mlp: MLPConfig = field(default_factory=MLPConfig)
    head: HeadConfig = field(default_factory=HeadConfig)


@dataclass
class CheckConfig:
    """``archlab-check``: one composed model, or (with no ``model=``) every preset."""

    model: ModelConfig = field(default_factory=ModelConfig)
    format: str = "table"  # table | json


@dataclass
class BenchConfig:
    """``archlab-bench``: one composed model against the Hugging Face implementation of its layout."""

    model: ModelConfig = field(default_factory=ModelConfig)
    batch_size: int = 8
    seq_len: Optional[int] = None
    warmup: int = 2
    repeats: int = 10
    generate_tokens: Optional[int] = None  # None: model.context_length minus the 8-token prompt
    device: str = "auto"
    dtype: str = "float32"
    threads: Optional[int] = None
    compare_hf: bool = True
    compile: bool = False
    matmul_size: Optional[int] = None
    checkpointing: bool = True
    format: str = "table"


def register_configs() -> None:
    """Put the schemas in Hydra's ConfigStore so YAML files are type-checked against them."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="check_schema", node=CheckConfig)
    cs.store(name="bench_schema", node=BenchConfig)
    from archlab.training.config import register_train_configs

    register_train_configs(cs)


def to_model_config(cfg: Any) -> ModelConfig:
    """Accept a ModelConfig, a DictConfig/dict of one, or a composed config with a ``model`` key."""
    if isinstance(cfg, ModelConfig):
        return cfg
    if isinstance(cfg, DictConfig):
        if "model" in cfg and "n_layer" not in cfg:
            cfg = cfg.model
        merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg)
        return OmegaConf.to_object(merged)
    if isinstance(cfg, dict):
        return to_model_config(OmegaConf.create(cfg))
    raise TypeError(f"expected a ModelConfig, DictConfig or dict, got {type(cfg).__name__}")


def model_config_dict(cfg: ModelConfig) -> dict:
    """The config as plain containers (for checkpoints, safetensors metadata and summaries)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg))


# ---- resolved sizes: the config's defaults spelled out, shared by the modules and the formulas ----


def head_dim(cfg: ModelConfig) -> int:
    a = cfg.attention
    return a.head_dim if a.head_dim is not None else cfg.d_model // a.n_head


def n_kv_head(cfg: ModelConfig) -> int:
    a = cfg.attention
    return a.n_kv_head if a.n_kv_head is not None else a.n_head


# ---- validation: every check runs before any tensor is allocated ----


def _positive(value: Any, name: str) -> None:
    if value is None or not 0 < value < math.inf:  # nan and inf are not sizes either
        raise ConfigError(name, value, "a positive number")


def _probability(value: float, name: str) -> None:
    if not 0.0 <= value < 1.0:
        raise ConfigError(name, value, "a probability in [0, 1)")


def validate(cfg: ModelConfig) -> ModelConfig:
    """Raise one ConfigError naming the first inconsistent field; return the config unchanged."""
    from archlab.nn.block import BLOCKS
    from archlab.nn.mlp import MLPS
    from archlab.nn.norms import NORMS
    from archlab.nn.positions import POSITIONS

    for name in ("vocab_size", "context_length", "n_layer", "d_model"):
        _positive(getattr(cfg, name), f"model.{name}")
    _probability(cfg.dropout, "model.dropout")
    _positive(cfg.init_std, "model.init_std")

    a = cfg.attention
    _positive(a.n_head, "model.attention.n_head")
    if a.head_dim is None:
        if cfg.d_model % a.n_head:
            raise ConfigError(
                "model.attention.n_head",
                a.n_head,
                f"a divisor of model.d_model={cfg.d_model}, or set model.attention.head_dim",
            )
    else:
        _positive(a.head_dim, "model.attention.head_dim")
    if a.n_kv_head is not None:
        _positive(a.n_kv_head, "model.attention.n_kv_head")
        if a.n_head % a.n_kv_head:
            raise ConfigError(
                "model.attention.n_kv_head",
                a.n_kv_head,
                f"a divisor of model.attention.n_head={a.n_head} (1 = MQA, n_head = MHA)",
            )
    _probability(a.dropout, "model.attention.dropout")

    NORMS.get(cfg.norm.kind).validate(cfg)
    BLOCKS.get(cfg.block.kind).validate(cfg)
    POSITIONS.get(cfg.position.kind).validate(cfg)
    MLPS.get(cfg.mlp.kind).validate(cfg)
    if not isinstance(cfg.head.tied, bool):
        raise ConfigError("model.head.tied", cfg.head.tied, "true or false")
    return cfg
