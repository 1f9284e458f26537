"""The config layer: schemas of the model and of every command, as plain dataclasses. It imports
neither ``archlab.nn`` nor ``archlab.training``; everything else reads it."""

from archlab.config.model import (
    AttentionConfig,
    BlockConfig,
    HeadConfig,
    LayersConfig,
    MLPConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
    embedding_dropout,
    model_config_dict,
    n_kv_head,
    recorded_model_config,
    to_model_config,
)

__all__ = [
    "AttentionConfig",
    "BlockConfig",
    "HeadConfig",
    "LayersConfig",
    "MLPConfig",
    "ModelConfig",
    "NormConfig",
    "PositionConfig",
    "embedding_dropout",
    "model_config_dict",
    "n_kv_head",
    "recorded_model_config",
    "to_model_config",
]
