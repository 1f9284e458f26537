"""``archlab-prepare input=<text file> output=<dir> tokenizer=char|byte|bpe [vocab_size=N] [val_fraction=0.1]``:
tokenise a text file into nanoGPT-format shards (``train.bin``, ``val.bin``) plus ``meta.json`` for ``data=tokens``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from archlab.config.commands import PrepareConfig
from archlab.data.common import check_fraction, read_text, split_point, token_dtype
from archlab.errors import ConfigError
from archlab.tokenizer import TOKENIZERS

USAGE = (
    "archlab-prepare input=<text file> output=<dir> [tokenizer=char|byte|bpe] [vocab_size=N (bpe)] [val_fraction=0.1]"
)
BPE_ALPHABET = 256  # byte-level BPE starts from the 256 byte symbols


def check(cfg: PrepareConfig) -> None:
    """Raise ConfigError for the first unusable setting, before the text is read."""
    TOKENIZERS.get(cfg.tokenizer)
    if cfg.tokenizer == "bpe":
        if cfg.vocab_size is None or cfg.vocab_size <= BPE_ALPHABET:
            raise ConfigError(
                "vocab_size",
                cfg.vocab_size,
                f"an integer > {BPE_ALPHABET} for tokenizer=bpe (the byte alphabet plus at least one merge)",
            )
    elif cfg.vocab_size is not None:
        raise ConfigError(
            "vocab_size", cfg.vocab_size, f"null for tokenizer={cfg.tokenizer} (its vocabulary is fixed by the text)"
        )
    check_fraction("val_fraction", cfg.val_fraction)
    out = Path(cfg.output).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError("output", cfg.output, "a directory to write the shards into (this path is a file)")
    parent = next(p for p in (out, *out.parents) if p.exists())  # the part of the path that exists already
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        why = "is not writable" if parent.is_dir() else "is a file"
        raise ConfigError("output", cfg.output, f"a directory this user can create or write into ({parent} {why})")


def prepare(cfg: PrepareConfig) -> dict:
    """Write the shards and ``meta.json`` into ``cfg.output``; return the metadata written."""
    check(cfg)
    text = read_text(cfg.input, "input")
    tokenizer = TOKENIZERS.get(cfg.tokenizer).fit(text, cfg.vocab_size)
    dtype = token_dtype(tokenizer.vocab_size)
    ids = np.asarray(tokenizer.encode(text), dtype=np.dtype(dtype).newbyteorder("<"))
    split = split_point(len(ids), cfg.val_fraction)
    if split == 0 or split == len(ids):
        raise ConfigError(
            "input",
            cfg.input,
            f"a text long enough to split: its {len(ids)} tokens leave an empty split"
            f" at val_fraction={cfg.val_fraction}",
        )
    out = Path(cfg.output).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    ids[:split].tofile(out / "train.bin")
    ids[split:].tofile(out / "val.bin")
    if cfg.tokenizer == "bpe":
        tokenizer.tok.save(str(out / "tokenizer.json"))  # the tokenizers library's own format
    meta = {
        "vocab_size": tokenizer.vocab_size,
        "dtype": dtype,
        "tokenizer": tokenizer.to_dict(),
        "train_tokens": split,
        "val_tokens": len(ids) - split,
        "val_fraction": cfg.val_fraction,
        "source": str(Path(cfg.input).expanduser().resolve()),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def parse(argv: Sequence[str]) -> PrepareConfig:
    """``key=value`` arguments checked against PrepareConfig's keys and types."""
    keys = ", ".join(PrepareConfig.__dataclass_fields__)
    for arg in argv:
        if "=" not in arg:
            raise ConfigError("argument", arg, f"key=value with a key among {keys}; usage: {USAGE}")
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(PrepareConfig), OmegaConf.from_dotlist(list(argv)))
    except OmegaConfBaseException as err:
        key = str(getattr(err, "full_key", None) or "argument")
        given = next((a.split("=", 1)[1] for a in argv if a.split("=", 1)[0] == key), " ".join(argv))
        raise ConfigError(
            key, given, f"one of the keys {keys} with a value of its type ({err.msg.splitlines()[0]})"
        ) from None
    for key in ("input", "output"):
        if OmegaConf.is_missing(cfg, key):
            raise ConfigError(key, None, f"a path; usage: {USAGE}")
    return OmegaConf.to_object(cfg)


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(f"usage: {USAGE}\n\n{__doc__}")
        return
    try:
        cfg = parse(argv)
        meta = prepare(cfg)
    except ConfigError as err:  # exit status 2, as the other archlab commands give for a bad setting
        print(f"archlab-prepare: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(
        f"wrote {meta['train_tokens']} training and {meta['val_tokens']} validation tokens "
        f"({meta['dtype']}, {meta['tokenizer']['kind']} vocabulary of {meta['vocab_size']}) to {cfg.output}\n"
        f"train on them with: archlab-train data=tokens data.dir={cfg.output}"
    )
    if cfg.vocab_size is not None and meta["vocab_size"] < cfg.vocab_size:
        print(
            f"note: the text gave {meta['vocab_size']} tokens, fewer than vocab_size={cfg.vocab_size}: BPE ran out of "
            "pairs to merge (a model trained on these shards takes its vocabulary size from meta.json)"
        )


if __name__ == "__main__":
    main()
