"""The config layer: schemas of the model and of every command, as plain dataclasses. It imports
neither ``archlab.nn`` nor ``archlab.training``; everything else reads it."""

from archlab.config.model import (
    MIXER_CONFIGS,
    BlockConfig,
    HeadConfig,
    LayersConfig,
    MixerConfig,
    MLPConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
    build_mixer_config,
    embedding_dropout,
    left_out,
    mixer_config,
    model_config_dict,
    n_kv_head,
    recorded_model_config,
    to_model_config,
)

__all__ = [
    "BlockConfig",
    "HeadConfig",
    "LayersConfig",
    "MIXER_CONFIGS",
    "MixerConfig",
    "MLPConfig",
    "ModelConfig",
    "NormConfig",
    "PositionConfig",
    "build_mixer_config",
    "embedding_dropout",
    "left_out",
    "mixer_config",
    "model_config_dict",
    "n_kv_head",
    "recorded_model_config",
    "to_model_config",
]
