"""archlab: decoder-only transformer variants from interchangeable registries, checked against
closed-form parameter counts."""

from archlab.build import build_model, compose_model, count_params
from archlab.config import ModelConfig
from archlab.errors import ConfigError

__all__ = ["ConfigError", "ModelConfig", "build_model", "compose_model", "count_params"]
