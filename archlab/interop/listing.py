"""What ``archlab-interop`` prints: every Hugging Face class archlab converts with the archlab parts it
maps to, every vision-language class whose language model it reads alone, every causal-LM class it refuses
with the part archlab lacks, and whether one checkpoint's config loads. Reads the family records; only ``config_verdict`` needs transformers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from archlab.errors import ConfigError
from archlab.interop.families import FAMILIES, refusals
from archlab.interop.families.refused import NOT_DECODER, WRAPPED


class Row(NamedTuple):
    model_type: str
    model_class: str
    title: str
    text: str  # the parts a supported class maps to, or what a refused one needs


def supported() -> list[Row]:
    """One row per family archlab converts both ways, by ``model_type``."""
    return [Row(t, f.model_class, f.title, f.parts) for t, f in sorted(FAMILIES.items())]


def wrapped() -> list[Row]:
    """One row per vision-language wrapper whose language model archlab reads alone (``refused.WRAPPED``)."""
    return [
        Row(t, w.model_class, w.title, f"its language model, as {FAMILIES[w.text].model_class} (`{w.text}`)")
        for t, w in sorted(WRAPPED.items())
    ]


def refused() -> list[Row]:
    """One row per decoder-only causal-LM family of transformers that archlab does not convert (none that
    a record converts, whatever ``refused.REFUSED`` says)."""
    return [Row(t, r.model_class, r.title, r.missing) for t, r in sorted(refusals().items())]


def summary() -> str:
    """The counts in one line: the families converted, the wrappers read as their language model, those
    refused, the causal-LM classes that are not decoder-only language models (printed first in every format, kept current in docs/interop.md)."""
    return (
        f"{len(supported())} families convert both ways, {len(wrapped())} vision-language classes load as their "
        f"language model, {len(refused())} are refused naming the part archlab lacks, {len(NOT_DECODER)} are not "
        "decoder-only language models"
    )


def _markdown(rows: list[Row], last: str) -> str:
    lines = [f"| `model_type` | class | {last} |", "|---|---|---|"]
    lines += [f"| `{r.model_type}` | `{r.model_class}` | {r.text} |" for r in rows]
    return "\n".join(lines)


def _text(rows: list[Row]) -> str:
    width_type = max(len(r.model_type) for r in rows)
    width_class = max(len(r.model_class) for r in rows)
    return "\n".join(f"  {r.model_type:<{width_type}}  {r.model_class:<{width_class}}  {r.text}" for r in rows)


def listing(fmt: str) -> str:
    """The summary line and the tables (``text``, ``markdown`` as docs/interop.md holds them, or ``json``)."""
    ok, no, inner = supported(), refused(), wrapped()
    others = ", ".join(sorted(NOT_DECODER))
    if fmt == "json":
        return json.dumps(
            {
                "summary": {
                    "converted": len(ok),
                    "language_model_of": len(inner),
                    "refused": len(no),
                    "not_decoder_only": len(NOT_DECODER),
                },
                "supported": [r._asdict() for r in ok],
                "language_model_of": [r._asdict() for r in inner],
                "refused": [r._asdict() for r in no],
                "not_decoder_only": sorted(NOT_DECODER),
            },
            indent=2,
        )
    if fmt == "markdown":
        return (
            f"{summary()}.\n\n{_markdown(ok, 'archlab parts')}\n\n"
            f"{_markdown(inner, 'what archlab reads (the rest left out)')}\n\n{_markdown(no, 'what archlab lacks')}\n\n"
            f"Not decoder-only language models (their causal-LM class is the decoder of an encoder model, or "
            f"multimodal): {others}."
        )
    return (
        f"{summary()}\n\n"
        f"Hugging Face classes archlab converts both ways ({len(ok)}): from_hf, load_hf_dir, to_hf, save_hf_dir\n"
        f"{_text(ok)}\n\nVision-language classes whose language model archlab reads alone ({len(inner)}): from_hf, "
        f"load_hf_dir\n{_text(inner)}\n\nCausal-LM classes archlab refuses ({len(no)}), with what it lacks\n{_text(no)}\n\n"
        f"Not decoder-only language models ({len(NOT_DECODER)}): {others}"
    )


def config_verdict(path: str) -> tuple[bool, str]:
    """Whether the Hugging Face config at ``path`` (a checkpoint directory or a config.json) loads into
    archlab: (True, the family and archlab's layout) or (False, the refusal)."""
    from archlab.interop.hf import config_from_hf, read_hf_config
    from archlab.interop.wrapped import text_config

    given = Path(path)
    if not given.exists():
        raise ConfigError("config", path, "an existing Hugging Face checkpoint directory or config.json")
    try:
        config: Any = read_hf_config(given)
        cfg = config_from_hf(config)
    except ConfigError as e:
        return False, f"does not load: {e}"
    text = text_config(config)
    family = FAMILIES[(config if text is None else text).model_type]
    inside = "" if text is None else f", the language model of this {config.model_type} (the rest left out)"
    return True, (
        f"loads as {family.title} ({family.model_class}){inside}: d_model {cfg.d_model}, {cfg.n_layer} layers, "
        f"{cfg.attention.kind} attention, {cfg.mlp.kind} MLP, {cfg.block.kind} block, {cfg.position.kind} positions"
    )
