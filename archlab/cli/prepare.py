"""archlab-prepare: tokenise a text file into nanoGPT-format shards (train.bin, val.bin) plus meta.json,
for data=tokens.

    archlab-prepare notes.txt output=shards                               # a bare path is the input
    archlab-prepare input=notes.txt output=shards tokenizer=bpe vocab_size=512
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from archlab import checks
from archlab.checks import writable_dir
from archlab.cli.errors import short_config_errors
from archlab.cli.settings import settings_or_help
from archlab.config.commands import PrepareConfig
from archlab.data.common import read_text, split_point, token_dtype
from archlab.errors import ConfigError
from archlab.tokenizer import TOKENIZERS

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
    checks.fraction("val_fraction", cfg.val_fraction)
    writable_dir("output", cfg.output)


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


@short_config_errors
def main(argv: Optional[Sequence[str]] = None) -> None:
    cfg = settings_or_help("archlab-prepare", __doc__, PrepareConfig, sys.argv[1:] if argv is None else argv, "input")
    if cfg is None:
        return
    meta = prepare(cfg)
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
