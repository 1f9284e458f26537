"""Held-out perplexity of a trained model on a text file or on prepared shards (their ``val.bin``).

The ids are read in windows of ``seq_len`` tokens starting every ``stride`` tokens; each window scores the
targets no earlier window scored, so every token but the first is scored once, with at least
``seq_len - stride`` tokens before it (all the window holds when ``stride == seq_len``, the default:
non-overlapping windows, as training's validation reads them). On shards, ``document_mask`` and
``reset_positions`` keep attention within documents and restart positions at each, as training does with
``data.document_mask`` / ``data.reset_positions``; without them windows run across documents, as training's do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F

from archlab import checks
from archlab.data.tokens import read_meta
from archlab.errors import ConfigError
from archlab.nn.model import Decoder, document_inputs

VAL = "val.bin"  # the split of a shard directory that perplexity reads


@dataclass
class HeldOut:
    """The ids to score, their name in the results (``perplexity:<file>``) and the EOS id separating their
    documents (None where none is known)."""

    ids: np.ndarray
    name: str
    eos_id: Optional[int]


def read_held_out(path: str, tokenizer: Any, vocab_size: int, field: str = "perplexity") -> HeldOut:
    """A UTF-8 text file encoded with the model's tokenizer, or a shard directory's ``val.bin`` (its
    meta.json's dtype; its tokenizer must be the model's), every id below ``vocab_size`` (the head's rows);
    ConfigError naming ``field`` otherwise."""
    source = Path(path).expanduser()
    if source.is_dir():
        meta = read_meta(source)
        if meta is None or not (source / VAL).is_file():
            raise ConfigError(field, path, f"a text file, or a shard directory with {VAL} and meta.json")
        if meta.get("tokenizer") is not None and meta["tokenizer"] != tokenizer.to_dict():
            raise ConfigError(field, path, "shards made with the model's tokenizer (these were made with another)")
        ids = np.fromfile(source / VAL, dtype=np.dtype(meta["dtype"]).newbyteorder("<")).astype(np.int64)
        eos = meta.get("eos_id")
        name, eos_id = f"{source.name}/{VAL}", eos if isinstance(eos, int) else None
    elif source.is_file():
        try:
            text = source.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(field, path, f"a UTF-8 text file ({err})") from None
        try:
            ids = np.array(tokenizer.encode(text), dtype=np.int64)
        except ValueError as err:
            raise ConfigError(field, path, f"text the model's tokenizer encodes ({err})") from None
        name, eos_id = source.name, None
    else:
        raise ConfigError(field, path, "a text file or a shard directory; nothing is at this path")
    if len(ids) < 2:
        raise ConfigError(field, path, f"at least 2 tokens to score (it holds {len(ids)})")
    if ids.max() >= vocab_size:
        allowed = f"ids below the model's {vocab_size} output ids (model.head.vocab, else model.vocab_size)"
        raise ConfigError(field, path, f"{allowed}; it holds {int(ids.max())}")
    return HeldOut(ids, f"perplexity:{name}", eos_id)


def check_settings(
    held_out: HeldOut, context: int, seq_len: Optional[int], stride: Optional[int], document_mask: bool, reset: bool
) -> tuple[int, int]:
    """The window and stride (null: the model's context; the window), each checked; the document flags
    against the ids (an EOS to split at) and each other."""
    window = context if seq_len is None else seq_len
    checks.integer("seq_len", window, 1, f"null or an integer in [1, model.context_length={context}]")
    if window > context:
        raise ConfigError("seq_len", window, f"null or an integer in [1, model.context_length={context}]")
    step = window if stride is None else stride
    checks.integer("stride", step, 1, f"null or an integer in [1, seq_len={window}]")
    if step > window:
        raise ConfigError("stride", step, f"null or an integer in [1, seq_len={window}] (a larger one skips tokens)")
    if reset and not document_mask:
        raise ConfigError("reset_positions", True, "false unless document_mask=true, as data.reset_positions")
    if document_mask and held_out.eos_id is None:
        raise ConfigError(
            "document_mask",
            True,
            f"false for {held_out.name}: shards whose meta.json names the eos_id ending documents",
        )
    return window, step


def windows(n: int, seq_len: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, end, first scored) of each window over ``n`` ids: inputs ``ids[start:end]``, targets
    ``ids[start + 1:end + 1]``, of which those from index ``first scored`` (in ``ids``) on are new."""
    out, scored = [], 1
    for start in range(0, n - 1, stride):
        end = min(start + seq_len, n - 1)
        out.append((start, end, scored))
        scored = end + 1
        if end == n - 1:
            break
    return out


@torch.no_grad()
def perplexity(
    model: Decoder,
    held_out: HeldOut,
    seq_len: int,
    stride: int,
    batch_size: int = 8,
    device: str = "cpu",
    document_mask: bool = False,
    reset_positions: bool = False,
) -> dict[str, float]:
    """The mean negative log-likelihood per scored token (nats), its exponential, and the counts."""
    model = model.to(device).eval()
    ids = torch.from_numpy(held_out.ids)
    spans = windows(len(ids), seq_len, stride)
    total, count = 0.0, 0
    for first in range(0, len(spans), batch_size):
        batch = spans[first : first + batch_size]
        for length in sorted({end - start for start, end, _ in batch}):  # one forward per window length
            same = [s for s in batch if s[1] - s[0] == length]
            x = torch.stack([ids[start:end] for start, end, _ in same]).to(device)
            y = torch.stack([ids[start + 1 : end + 1] for start, end, _ in same]).to(device)
            eos = held_out.eos_id if document_mask else None  # check_settings: document_mask needs one
            kwargs = document_inputs(x, eos, reset_positions) if eos is not None else {}
            nll = F.cross_entropy(model(x, **kwargs).float().transpose(1, 2), y, reduction="none")
            for row, (start, _, scored) in enumerate(same):
                total += nll[row, scored - start - 1 :].double().sum().item()
                count += nll.shape[1] - (scored - start - 1)
    mean = total / count
    return {"nll": mean, "ppl": math.exp(mean), "tokens": count, "windows": len(spans)}
