"""archlab-generate: continue a prompt with a trained model, using the KV cache. The model is found as
archlab-eval and archlab-export find it: a run directory (its model.safetensors), a training checkpoint (with
its run's tokenizer), a safetensors file written by archlab, or a Hugging Face directory (archlab-export's).

    archlab-generate outputs/run prompt="To be" max_new_tokens=100 temperature=0.8 top_k=50 seed=0
    archlab-generate outputs/run/checkpoints/last.ckpt prompt="To be" temperature=0
    archlab-generate ckpt=model.safetensors prompt_ids=[1,2,3] temperature=0   # a file without a tokenizer
    archlab-generate outputs/run prompt="To be" temperature=0 speculative=true  # drafted by model.head.mtp

Settings are key=value like the Hydra apps, but parsed here: everything after prompt= is taken verbatim,
so a prompt may hold commas, quotes and colons that Hydra's override grammar would reject.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import torch

from archlab.cli.errors import short_config_errors
from archlab.cli.settings import parse, settings_or_help
from archlab.config.commands import GenerateConfig
from archlab.errors import ConfigError
from archlab.generate import generate
from archlab.precision import check_device
from archlab.speculative import speculate


def parse_settings(settings: list[str]) -> GenerateConfig:
    """``key=value`` strings (a bare path is the ckpt) -> a type-checked GenerateConfig; a bad key or
    value raises ConfigError."""
    return parse(GenerateConfig, settings, bare="ckpt")


def run(cfg: GenerateConfig) -> str:
    """The generated sequence (prompt included) as text, or as a JSON list of ids without a tokenizer."""
    from archlab.evaluation.models import find_model, load
    from archlab.interop.export import SOURCES

    if cfg.ckpt is None:
        raise ConfigError("ckpt", cfg.ckpt, f"{SOURCES}, or a Hugging Face directory (archlab-export's)")
    found = find_model(cfg.ckpt, "ckpt")
    if (cfg.prompt is None) == (cfg.prompt_ids is None):
        raise ConfigError("prompt", cfg.prompt, "exactly one of prompt=<text> or prompt_ids=[...]")
    if cfg.seed is not None and not 0 <= cfg.seed < 2**63:
        raise ConfigError("seed", cfg.seed, "null or an integer in [0, 2**63)")
    check_device(cfg.device)
    if cfg.speculative and cfg.temperature != 0:
        raise ConfigError("temperature", cfg.temperature, "0 with speculative=true (drafts are checked greedily)")
    tokenizer = found.tokenizer
    if cfg.prompt is not None:
        if tokenizer is None:
            raise ConfigError("prompt", cfg.prompt, f"prompt_ids=[...] instead: {cfg.ckpt} holds no tokenizer")
        try:
            ids = tokenizer.encode(cfg.prompt)
        except ValueError as e:
            raise ConfigError("prompt", cfg.prompt, f"text the checkpoint's tokenizer can encode ({e})") from None
    else:
        ids = cfg.prompt_ids
    if not ids:
        field = "prompt" if cfg.prompt is not None else "prompt_ids"
        raise ConfigError(field, cfg.prompt if cfg.prompt is not None else ids, "a prompt of at least one token")
    model = load(found).to(cfg.device)
    generator = torch.Generator(cfg.device).manual_seed(cfg.seed) if cfg.seed is not None else None
    prompt = torch.tensor([ids], dtype=torch.long, device=cfg.device)
    if cfg.speculative:
        done = speculate(model, prompt, cfg.max_new_tokens)
        rate = f" ({done.accepted / done.drafted:.0%})" if done.drafted else ""
        print(
            f"speculative: {done.rounds} forwards of the model after the prompt for {cfg.max_new_tokens} tokens; "
            f"{done.accepted} of {done.drafted} drafted tokens kept{rate}",
            file=sys.stderr,
        )
        out = done.ids[0].tolist()
    else:
        out = generate(model, prompt, cfg.max_new_tokens, cfg.temperature, cfg.top_k, generator)[0].tolist()
    return tokenizer.decode(out) if tokenizer is not None else json.dumps(out)


@short_config_errors
def main(argv: Optional[list[str]] = None) -> None:
    cfg = settings_or_help("archlab-generate", __doc__, GenerateConfig, sys.argv[1:] if argv is None else argv, "ckpt")
    if cfg is not None:
        print(run(cfg))


if __name__ == "__main__":
    main()
