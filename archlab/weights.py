"""Model weights on disk: one safetensors file carrying the resolved model config in its metadata."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from archlab.config import model_config_dict, to_model_config
from archlab.nn.model import Decoder

CONFIG_KEY = "archlab_model_config"


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


def read_config(path: str | os.PathLike) -> Any:
    """The model config stored in a safetensors file written by ``save_weights``."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if CONFIG_KEY not in meta:
        raise ValueError(f"{path}: no {CONFIG_KEY!r} in the safetensors metadata; not an archlab export")
    return to_model_config(json.loads(meta[CONFIG_KEY]))


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
