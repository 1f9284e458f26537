"""A Hugging Face directory's config.json read, and checked against the shapes its weights file records,
before any weights are read: an edited or broken config.json (invalid JSON, a ``model_type`` archlab does
not convert, ``n_layer``, ``vocab_size`` or ``n_positions`` that its weights do not have) is one ConfigError
naming the file and the key, where loading would fail with a traceback."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Optional

from archlab.config import ModelConfig
from archlab.errors import ConfigError

HF_CONFIG = "config.json"  # what marks a Hugging Face directory
WEIGHTS = "model.safetensors"  # its weights, unless sharded
INDEX = "model.safetensors.index.json"  # a sharded checkpoint's tensor -> file map
LAYER = re.compile(r"\.(\d+)\.")  # a tensor's layer index: the first number between dots in its name
EXPLAINS = {  # the model fields an edit of config.json may have changed, and what the weights hold of each
    "n_layer": "layers",
    "vocab_size": "embedding rows",
    "context_length": "position rows",
    "d_model": "width",
}


def read_hf_dir(path: Path, field: str) -> ModelConfig:
    """The archlab config of the Hugging Face directory ``path``, its config.json checked against its
    weights; ConfigError naming ``field`` (invalid JSON) or ``<config.json>: <key>`` otherwise."""
    from archlab.interop.hf import config_from_hf, read_hf_config

    file = path / HF_CONFIG
    try:
        keys = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(field, str(file), f"a config.json that is JSON ({err})") from None
    if not isinstance(keys, dict):
        raise ConfigError(field, str(file), "a config.json holding a JSON object")
    try:
        config = config_from_hf(read_hf_config(path))
    except ConfigError as err:
        raise ConfigError(f"{file}: {err.field}", err.value, err.allowed) from None
    except Exception as err:  # noqa: BLE001 - transformers' own checks of a value raise their own types
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            field, str(file), f"a config.json transformers reads ({type(err).__name__}: {reason})"
        ) from None
    check_weights(path, config, keys)
    return config


def weight_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape as the directory's safetensors headers record it (no tensor is read); ``{}``
    where there is no safetensors file."""
    from safetensors import safe_open

    index = path / INDEX
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [WEIGHTS]
    shapes: dict[str, tuple[int, ...]] = {}
    for name in files:
        if not (path / name).is_file():
            return {}
        with safe_open(str(path / name), framework="pt") as f:
            shapes.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
    return shapes


def expected_shapes(config: ModelConfig) -> Optional[dict[str, tuple[int, ...]]]:
    """The Hugging Face tensors ``config`` holds, by name, with their shapes (built on the meta device);
    None where the config is no valid model."""
    from archlab.build import build_model
    from archlab.interop.hf import archlab_state_to_hf

    try:
        state = build_model(config, device="meta").state_dict()
        return {k: tuple(v.shape) for k, v in archlab_state_to_hf(config, state).items()}
    except ConfigError:
        return None


def layers(names: Any) -> set[int]:
    return {int(m[1]) for m in map(LAYER.search, names) if m}


def fits(expected: Optional[dict[str, tuple[int, ...]]], held: dict[str, tuple[int, ...]]) -> bool:
    """Whether the weights hold every tensor ``expected`` names, at its shape, and no other layer."""
    return (
        expected is not None and all(held.get(k) == v for k, v in expected.items()) and layers(expected) == layers(held)
    )


def check_weights(path: Path, config: ModelConfig, keys: dict[str, Any]) -> None:
    """ConfigError naming the config.json key whose value the weights do not have (the one model field that,
    set to what the weights hold, makes every tensor fit), else the first tensor whose shape differs. Weights
    named otherwise (an older checkpoint's names, which loading renames) are left to loading."""
    from archlab.interop.hf import config_to_hf

    held, expected = weight_shapes(path), expected_shapes(config)
    if not held or expected is None or fits(expected, held) or not expected.keys() & held.keys():
        return
    differ = [k for k, v in expected.items() if k in held and held[k] != v]
    sizes = {"n_layer": {len(layers(held))}}
    for name in ("vocab_size", "context_length", "d_model"):
        sizes[name] = {size for k in differ for size in held[k]}
    file, weights = path / HF_CONFIG, path / WEIGHTS
    for name, values in sizes.items():
        for value in sorted(values):
            edited = dataclasses.replace(config, **{name: value})
            if value == getattr(config, name) or not fits(expected_shapes(edited), held):
                continue
            ours, theirs = config_to_hf(config).to_dict(), config_to_hf(edited).to_dict()
            changed = [k for k in keys if k in ours and ours[k] != theirs.get(k)]  # layer_types too, for n_layer
            key = next((k for k in changed if keys[k] == getattr(config, name)), changed[0] if changed else name)
            raise ConfigError(
                f"{file}: {key}", keys.get(key), f"{theirs.get(key, value)}, the {EXPLAINS[name]} {weights} holds"
            )
    if differ:
        first = differ[0]
        raise ConfigError(f"{file}: {first}", expected[first], f"{held[first]}, the shape {weights} holds")
