"""What ``archlab-eval`` evaluates, found as ``archlab-export`` finds it: a run directory (its
``model.safetensors``), a training checkpoint (with its run's tokenizer), a safetensors file written by
archlab, or a Hugging Face directory (``archlab-export``'s output: config.json, weights, tokenizer.json, and
archlab's own tokenizer, which it takes where there is one, so the run's shards are the export's too).
``read_model`` checks the source and reads its config and tokenizer; ``load_model`` reads the weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from archlab.config import ModelConfig
from archlab.errors import ConfigError
from archlab.evaluation.hf_dir import HF_CONFIG, read_hf_dir
from archlab.interop.export import SOURCES, load_model, read_export_tokenizer, read_json, read_source, run_eos, run_of
from archlab.nn.model import Decoder
from archlab.tokenizer import BPETokenizer


@dataclass
class EvalModel:
    """A checked source: its weights (a file, or a Hugging Face directory), model config, tokenizer, EOS
    id (None where none is known) and the run directory it belongs to (None for a file outside a run)."""

    weights: Path
    config: ModelConfig
    tokenizer: Any
    eos_id: Optional[int]
    run: Optional[Path]


def _hf_eos(path: Path, tokenizer: Optional[BPETokenizer]) -> Optional[int]:
    """A Hugging Face directory's EOS: config.json's ``eos_token_id``, else tokenizer_config.json's token."""
    found = read_json(path / HF_CONFIG).get("eos_token_id")
    found = found[0] if isinstance(found, list) and found else found
    if isinstance(found, int):
        return found
    token = read_json(path / "tokenizer_config.json").get("eos_token")
    token = token.get("content") if isinstance(token, dict) else token
    return tokenizer.tok.token_to_id(token) if tokenizer is not None and isinstance(token, str) else None


def find_model(source: str, field: str = "source") -> EvalModel:
    """The checked ``source`` (a run directory, a checkpoint, a safetensors file or a Hugging Face
    directory), its tokenizer None where it has none; ConfigError naming ``field`` where no model is there.
    ``archlab-generate`` finds its model here too."""
    path = Path(source).expanduser()
    if path.is_dir() and (path / HF_CONFIG).is_file():
        config = read_hf_dir(path, field)
        file = path / "tokenizer.json"
        hf_tokenizer = BPETokenizer.load(file, field) if file.is_file() else None
        tokenizer = read_export_tokenizer(path, field) or hf_tokenizer
        return EvalModel(path, config, tokenizer, _hf_eos(path, hf_tokenizer), None)
    weights, config, tokenizer = read_source(source, field)
    run = path if path.is_dir() else run_of(weights)
    return EvalModel(weights, config, tokenizer, run_eos(run), run)


def read_model(source: str, field: str = "source") -> EvalModel:
    """The checked ``source``: ConfigError naming ``field`` where nothing evaluable is there, or it has no
    tokenizer (lm-eval's tasks are text)."""
    found = find_model(source, field)
    if found.tokenizer is None:
        raise ConfigError(
            field,
            source,
            f"{SOURCES}, or a Hugging Face directory, with a tokenizer (a run on text or prepared shards "
            "writes one): lm-eval's tasks are text",
        )
    return found


def load(model: EvalModel) -> Decoder:
    """The Decoder of a checked source, on the CPU, in its stored dtype."""
    if model.weights.is_dir():
        from archlab.interop.hf import load_hf_dir

        return load_hf_dir(model.weights)
    return load_model(model.weights, model.config)
