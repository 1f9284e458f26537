"""archlab-generate: continue a prompt with a model saved by archlab (safetensors), using the KV cache.

    archlab-generate ckpt=model.safetensors prompt="To be" max_new_tokens=100 temperature=0.8 top_k=50 seed=0
    archlab-generate ckpt=model.safetensors prompt_ids=[1,2,3] temperature=0   # a file without a tokenizer

Settings are ``key=value`` like the Hydra apps, but parsed here: everything after ``prompt=`` is taken
verbatim, so a prompt may hold commas, quotes and colons that Hydra's override grammar would reject.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path
from typing import Any, Optional

import torch
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from archlab.cli.errors import short_config_errors
from archlab.config.commands import GenerateConfig
from archlab.errors import ConfigError, check_device

TOKENIZER_KEY = "archlab_tokenizer"


_TEXT_FIELDS = {"ckpt", "prompt", "device"}  # taken verbatim; other values are parsed as YAML


def parse_settings(settings: list[str]) -> GenerateConfig:
    """``key=value`` strings -> a type-checked GenerateConfig; a bad key or value raises ConfigError."""
    names = [f.name for f in fields(GenerateConfig)]
    values: dict[str, Any] = {}
    for setting in settings:
        key, sep, raw = setting.partition("=")
        if not sep or key not in names:
            raise ConfigError(key, raw if sep else None, f"key=value settings with a key among {names}")
        try:
            values[key] = raw if key in _TEXT_FIELDS else yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ConfigError(key, raw, "a number, null or a [list] of ids") from None
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(GenerateConfig), values)
    except ValidationError as e:
        key = str(e.full_key).split("[")[0]
        types = {f.name: f.type for f in fields(GenerateConfig)}
        raise ConfigError(key, values.get(key), f"a value of type {types.get(key)}") from None
    return OmegaConf.to_object(cfg)


def _read_export(path: Path) -> dict[str, str]:
    """The metadata of an archlab safetensors export; ConfigError for any other file."""
    from safetensors import safe_open

    from archlab.weights import CONFIG_KEY

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as err:  # not safetensors, or cut short: the library's message says which
        raise ConfigError(
            "ckpt", str(path), f"a safetensors file written by archlab (this one does not read: {err})"
        ) from None
    if CONFIG_KEY not in meta:
        raise ConfigError(
            "ckpt",
            str(path),
            f"a safetensors file written by archlab (this one has no {CONFIG_KEY!r} "
            "metadata: archlab-train writes <run>/model.safetensors)",
        )
    return meta


def run(cfg: GenerateConfig) -> str:
    """The generated sequence (prompt included) as text, or as a JSON list of ids without a tokenizer."""
    from archlab.generate import generate
    from archlab.tokenizer import tokenizer_from_dict
    from archlab.weights import load_weights

    if cfg.ckpt is None or not Path(cfg.ckpt).is_file():
        raise ConfigError("ckpt", cfg.ckpt, "an existing safetensors file written by archlab.weights.save_weights")
    if (cfg.prompt is None) == (cfg.prompt_ids is None):
        raise ConfigError("prompt", cfg.prompt, "exactly one of prompt=<text> or prompt_ids=[...]")
    if cfg.seed is not None and not 0 <= cfg.seed < 2**63:
        raise ConfigError("seed", cfg.seed, "null or an integer in [0, 2**63)")
    check_device(cfg.device)
    spec = _read_export(Path(cfg.ckpt)).get(TOKENIZER_KEY)
    tokenizer = tokenizer_from_dict(json.loads(spec)) if spec else None
    if cfg.prompt is not None:
        if tokenizer is None:
            raise ConfigError(
                "prompt", cfg.prompt, f"prompt_ids=[...] instead: {cfg.ckpt} has no {TOKENIZER_KEY!r} metadata"
            )
        try:
            ids = tokenizer.encode(cfg.prompt)
        except ValueError as e:
            raise ConfigError("prompt", cfg.prompt, f"text the checkpoint's tokenizer can encode ({e})") from None
    else:
        ids = cfg.prompt_ids
    if not ids:
        field = "prompt" if cfg.prompt is not None else "prompt_ids"
        raise ConfigError(field, cfg.prompt if cfg.prompt is not None else ids, "a prompt of at least one token")
    model = load_weights(cfg.ckpt, device=cfg.device)
    generator = torch.Generator(cfg.device).manual_seed(cfg.seed) if cfg.seed is not None else None
    prompt = torch.tensor([ids], dtype=torch.long, device=cfg.device)
    out = generate(model, prompt, cfg.max_new_tokens, cfg.temperature, cfg.top_k, generator)[0].tolist()
    return tokenizer.decode(out) if tokenizer is not None else json.dumps(out)


@short_config_errors
def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="archlab-generate",
        description="Continue a prompt with an archlab safetensors model (greedy at temperature=0, else sampled).",
        epilog="settings (key=value): " + ", ".join(f"{f.name} (default {f.default})" for f in fields(GenerateConfig)),
    )
    parser.add_argument("settings", nargs="*", metavar="key=value")
    print(run(parse_settings(parser.parse_args(argv).settings)))


if __name__ == "__main__":
    main()
