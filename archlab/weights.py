"""Model weights on disk: one safetensors file carrying the resolved model config in its metadata."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from archlab.config import model_config_dict, recorded_model_config
from archlab.errors import ConfigError
from archlab.nn.model import Decoder
from archlab.tokenizer import tokenizer_from_dict

CONFIG_KEY = "archlab_model_config"  # the resolved model config, as JSON: what load_weights rebuilds
TOKENIZER_KEY = "archlab_tokenizer"  # the tokenizer's to_dict(), as JSON: a training export's text <-> ids


def state_dict_for_export(model: Decoder) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies of every tensor; a tied head is stored once (as ``tok_emb.weight``)."""
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.cfg.head.tied:
        state.pop("head.weight")
    return state


def save_weights(model: Decoder, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> Path:
    """Write ``model`` to ``path`` (safetensors) atomically: a temporary file, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {CONFIG_KEY: json.dumps(model_config_dict(model.cfg)), **(metadata or {})}
    tmp = path.with_name(path.name + ".tmp")
    save_file(state_dict_for_export(model), str(tmp), metadata=meta)
    os.replace(tmp, path)
    return path


def read_metadata(path: str | os.PathLike, field: str = "path") -> dict[str, str]:
    """The metadata of a safetensors file written by ``save_weights``; any other file (not safetensors,
    cut short, or without the model config) raises one ConfigError naming ``field``."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as err:  # not safetensors, or cut short: the library's message says which
        raise ConfigError(
            field, str(path), f"a safetensors file written by archlab (this one does not read: {err})"
        ) from None
    if CONFIG_KEY not in meta:
        raise ConfigError(
            field,
            str(path),
            f"a safetensors file written by archlab (this one has no {CONFIG_KEY!r} "
            "metadata: archlab-train writes <run>/model.safetensors)",
        )
    return meta


def read_config(path: str | os.PathLike) -> Any:
    """The model config stored in a safetensors file written by ``save_weights``."""
    return recorded_model_config(json.loads(read_metadata(path)[CONFIG_KEY]))


def read_tokenizer(path: str | os.PathLike, field: str = "path") -> Any:
    """The tokenizer a training export carries (``TOKENIZER_KEY``), or None for a file without one."""
    spec = read_metadata(path, field).get(TOKENIZER_KEY)
    return tokenizer_from_dict(json.loads(spec)) if spec else None


def load_weights(path: str | os.PathLike, device: str | torch.device = "cpu") -> Decoder:
    """Rebuild the model from the config stored in ``path`` and load its weights."""
    from safetensors.torch import load_file

    from archlab.build import build_model

    model = build_model(read_config(path), device=device)
    state = load_file(str(path), device=str(device))
    if model.cfg.head.tied:
        state["head.weight"] = state["tok_emb.weight"]
    model.load_state_dict(state, strict=True)
    return model
