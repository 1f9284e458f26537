"""archlab-prepare: tokenise a text file or a corpus (JSONL, Parquet, a datasets directory) into
nanoGPT-format shards (train.bin, val.bin) plus meta.json, for data=tokens.

    archlab-prepare notes.txt output=shards                               # a bare path is the input
    archlab-prepare input=notes.txt output=shards tokenizer=bpe vocab_size=512
    archlab-prepare input=corpus.jsonl output=shards tokenizer=bpe vocab_size=4096
    archlab-prepare input=corpus/ output=shards tokenizer=gpt2/tokenizer.json workers=8
    archlab-prepare input=test.jsonl output=test_shards tokenizer=shards val_fraction=1   # evaluation only
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from archlab import checks
from archlab.checks import writable_dir
from archlab.cli.errors import short_config_errors
from archlab.cli.settings import settings_or_help
from archlab.config.commands import PrepareConfig
from archlab.data.chunks import (
    Plan,
    begin,
    default_workers,
    finish,
    input_state,
    validation_documents,
    write_shards,
)
from archlab.data.common import evaluation_only, read_text, split_point, token_dtype
from archlab.data.corpus import Corpus, open_corpus
from archlab.errors import ConfigError
from archlab.tokenizer import TOKENIZERS, BPETokenizer, end_of_document

BPE_ALPHABET = 256  # byte-level BPE starts from the 256 byte symbols
FITTED_EOS = "<|endoftext|>"  # the EOS a BPE fitted to a corpus gets (GPT-2's), unless eos= names another
DTYPES = {"uint16": 2**16, "uint32": 2**32}  # shard dtype -> ids it holds


def pretrained_file(tokenizer: str) -> Optional[Path]:
    """The tokenizer.json that ``tokenizer=`` names (the file, or the one in a model directory); None for
    a fitted kind (char, byte, bpe)."""
    if tokenizer in TOKENIZERS:
        return None
    path = Path(tokenizer).expanduser()
    if path.is_file() or (path / "tokenizer.json").is_file():
        return path if path.is_file() else path / "tokenizer.json"
    why = " (this directory holds no tokenizer.json)" if path.is_dir() else ""
    raise ConfigError(
        "tokenizer", tokenizer, f"one of {TOKENIZERS.names()}, a tokenizer.json or a model directory holding one{why}"
    )


def check(cfg: PrepareConfig) -> None:
    """Raise ConfigError for the first unusable setting, before the input is read."""
    if pretrained_file(cfg.tokenizer) is not None:
        if cfg.vocab_size is not None:
            raise ConfigError("vocab_size", cfg.vocab_size, "null for a pretrained tokenizer (its vocabulary is given)")
    elif cfg.tokenizer == "bpe":
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
    if cfg.val_fraction != 1:
        checks.fraction("val_fraction", cfg.val_fraction)
    elif pretrained_file(cfg.tokenizer) is None and cfg.tokenizer != "byte":
        raise ConfigError(
            "tokenizer",
            cfg.tokenizer,
            "a training run's tokenizer for val_fraction=1 (an evaluation-only preparation): its tokenizer.json or "
            "shard directory, or byte; a tokenizer fitted to held-out text would not be the model's",
        )
    if cfg.dtype is not None:
        checks.choice("dtype", cfg.dtype, [None, *DTYPES])
        if cfg.vocab_size is not None:
            shard_dtype(cfg, cfg.vocab_size)
    if cfg.workers is not None:
        checks.integer("workers", cfg.workers)
    checks.integer("chunk_documents", cfg.chunk_documents)
    writable_dir("output", cfg.output)
    check_output(cfg)


def check_output(cfg: PrepareConfig) -> None:
    """An output directory that holds a finished preparation is prepared again only with the same tokenizer
    (the same kind fitted again, or the same tokenizer.json, by its SHA-256) and for the same use (training,
    or evaluation only): anything else would leave files of two preparations side by side."""
    out = Path(cfg.output).expanduser()
    try:
        meta = json.loads((out / "meta.json").read_text())
        kind, recorded, before = meta["tokenizer"]["kind"], meta.get("tokenizer_file"), meta["val_fraction"]
    except (OSError, ValueError, TypeError, KeyError):
        return  # no finished preparation there (an interrupted one is checked by its progress.json)
    fitted = out / "tokenizer.json"  # where a BPE fitted by archlab-prepare is kept
    if isinstance(recorded, dict):
        was, sha = recorded.get("path"), recorded.get("sha256")
    else:
        was, sha = f"tokenizer={kind}", file_record(fitted)["sha256"] if fitted.is_file() else None
    given = pretrained_file(cfg.tokenizer)
    same = kind == cfg.tokenizer and not isinstance(recorded, dict)
    if not same and (given is None or file_record(given)["sha256"] != sha):
        raise ConfigError(
            "output",
            cfg.output,
            f"a new directory, or one prepared with the same tokenizer: {out} holds shards made with {was}, "
            f"this run's is tokenizer={cfg.tokenizer} (give another output, or delete {out} first)",
        )
    if evaluation_only(before) != evaluation_only(cfg.val_fraction):
        uses = {True: "an evaluation-only preparation (val.bin alone)", False: "shards to train on (train.bin)"}
        raise ConfigError(
            "output",
            cfg.output,
            f"a new directory, or one prepared for the same use: {out} holds {uses[evaluation_only(before)]}, "
            f"this run writes {uses[evaluation_only(cfg.val_fraction)]} (give another output, or delete {out} first)",
        )


def shard_dtype(cfg: PrepareConfig, vocab_size: int) -> str:
    """``dtype``, or the smaller one that holds ``vocab_size`` ids; ConfigError when the given one cannot."""
    dtype = cfg.dtype or token_dtype(vocab_size)
    if vocab_size > DTYPES[dtype]:
        raise ConfigError("dtype", dtype, f"a dtype holding the tokenizer's {vocab_size} ids: null or uint32")
    return dtype


def file_record(path: Path) -> dict[str, str]:
    """A pretrained tokenizer as meta.json records it: its path and the SHA-256 of its tokenizer.json."""
    return {"path": str(path.resolve()), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def prepare(cfg: PrepareConfig) -> dict:
    """Write the shards and ``meta.json`` into ``cfg.output``; return the metadata written."""
    check(cfg)
    corpus = open_corpus(cfg.input, cfg.format, cfg.text_field)
    if corpus.format == "text":
        return prepare_text(cfg, corpus.files[0])
    return prepare_corpus(cfg, corpus)


def prepare_text(cfg: PrepareConfig, source: Path) -> dict:
    """A text file: its tokens split by position (the last ``val_fraction`` validate), no EOS."""
    if cfg.eos is not None:
        raise ConfigError("eos", cfg.eos, "null for a text file (it is one document)")
    pretrained = pretrained_file(cfg.tokenizer)
    loaded = None if pretrained is None else BPETokenizer.load(pretrained, "tokenizer")
    if loaded is not None:
        shard_dtype(cfg, loaded.vocab_size)
    text = read_text(source, "input")
    tokenizer = loaded or TOKENIZERS.get(cfg.tokenizer).fit(text, cfg.vocab_size)
    dtype = shard_dtype(cfg, tokenizer.vocab_size)
    ids = np.asarray(tokenizer.encode(text), dtype=np.dtype(dtype).newbyteorder("<"))
    split = split_point(len(ids), cfg.val_fraction)
    if (split == 0 and not evaluation_only(cfg.val_fraction)) or split == len(ids):
        raise ConfigError(
            "input",
            cfg.input,
            f"a text long enough to split: its {len(ids)} tokens leave an empty split"
            f" at val_fraction={cfg.val_fraction}",
        )
    out = Path(cfg.output).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    if split:
        ids[:split].tofile(out / "train.bin")
    ids[split:].tofile(out / "val.bin")
    if cfg.tokenizer == "bpe":
        tokenizer.tok.save(str(out / "tokenizer.json"))  # the tokenizers library's own format
    meta = {
        "vocab_size": tokenizer.vocab_size,
        "dtype": dtype,
        "tokenizer": tokenizer.to_dict(),
        **({} if pretrained is None else {"tokenizer_file": file_record(pretrained)}),
        "train_tokens": split,
        "val_tokens": len(ids) - split,
        "val_fraction": cfg.val_fraction,
        "source": str(Path(cfg.input).expanduser().resolve()),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def prepare_corpus(cfg: PrepareConfig, corpus: Corpus) -> dict:
    """A corpus: each document's tokens followed by EOS, ``val_fraction`` of the documents (spread evenly)
    validating, tokenised in chunks by ``workers`` processes; a run interrupted in ``output`` continues."""
    pretrained = pretrained_file(cfg.tokenizer)
    if pretrained is None and cfg.tokenizer != "bpe":
        raise ConfigError(
            "tokenizer",
            cfg.tokenizer,
            "bpe or a pretrained tokenizer for a corpus (its documents end with an EOS token, which char and byte lack)",
        )
    val_documents = validation_documents(corpus.documents, cfg.val_fraction)
    if val_documents == 0 or (val_documents == corpus.documents and not evaluation_only(cfg.val_fraction)):
        raise ConfigError(
            "input",
            cfg.input,
            f"a corpus large enough to split: its {corpus.documents} documents leave an empty split"
            f" at val_fraction={cfg.val_fraction}",
        )
    out = Path(cfg.output).expanduser()
    if pretrained is not None:
        tokenizer = BPETokenizer.load(pretrained, "tokenizer")
        eos, eos_id = end_of_document(tokenizer, pretrained, cfg.eos)
        dtype = shard_dtype(cfg, tokenizer.vocab_size)
        tokenizer_identity: Any = file_record(pretrained)
    else:
        tokenizer, eos, eos_id, dtype = None, cfg.eos or FITTED_EOS, None, cfg.dtype
        tokenizer_identity = {"kind": "bpe", "vocab_size": cfg.vocab_size}
    identity = {
        "input": input_state(corpus.files, corpus.documents),
        "format": corpus.format,
        "text_field": cfg.text_field,
        "tokenizer": tokenizer_identity,
        "eos": eos,
        "dtype": cfg.dtype,
        "val_fraction": cfg.val_fraction,
        "chunk_documents": cfg.chunk_documents,
    }
    continuing = begin(out, identity)
    if tokenizer is None:  # a BPE fitted to the corpus, saved before any chunk so that a continued run reuses it
        saved = out / "tokenizer.json"
        if continuing and saved.is_file():
            tokenizer = BPETokenizer.load(saved, "output")
        else:
            tokenizer = BPETokenizer.fit(corpus.texts(), cfg.vocab_size, special_tokens=[eos])
            tokenizer.tok.save(str(saved))
        eos_id = tokenizer.tok.token_to_id(eos)
        dtype = shard_dtype(cfg, tokenizer.vocab_size)
    assert eos_id is not None and dtype is not None  # set by either branch
    plan = Plan(out, tokenizer.tok.to_str(), eos_id, dtype, cfg.val_fraction, cfg.chunk_documents)
    counts = write_shards(corpus, plan, default_workers(cfg.workers))
    meta = {
        "vocab_size": tokenizer.vocab_size,
        "dtype": dtype,
        "tokenizer": tokenizer.to_dict(),
        **({} if pretrained is None else {"tokenizer_file": file_record(pretrained)}),
        "eos_token": eos,
        "eos_id": eos_id,
        **counts,
        "val_fraction": cfg.val_fraction,
        "split": "documents",
        "format": corpus.format,
        "text_field": cfg.text_field,
        "sources": [str(f.resolve()) for f in corpus.files],
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    finish(out)
    return meta


@short_config_errors
def main(argv: Optional[Sequence[str]] = None) -> None:
    cfg = settings_or_help("archlab-prepare", __doc__, PrepareConfig, sys.argv[1:] if argv is None else argv, "input")
    if cfg is None:
        return
    meta = prepare(cfg)
    documents = f" in {meta['train_documents']} and {meta['val_documents']} documents" if "eos_id" in meta else ""
    use = (
        f"evaluate a model of this tokenizer on them with: archlab-eval <run directory> perplexity={cfg.output}"
        if evaluation_only(cfg.val_fraction)
        else f"train on them with: archlab-train data=tokens data.dir={cfg.output}"
    )
    print(
        f"wrote {meta['train_tokens']} training and {meta['val_tokens']} validation tokens{documents} "
        f"({meta['dtype']}, {meta['tokenizer']['kind']} vocabulary of {meta['vocab_size']}) to {cfg.output}\n{use}"
    )
    if cfg.vocab_size is not None and meta["vocab_size"] < cfg.vocab_size:
        print(
            f"note: the text gave {meta['vocab_size']} tokens, fewer than vocab_size={cfg.vocab_size}: BPE ran out of "
            "pairs to merge (a model trained on these shards takes its vocabulary size from meta.json)"
        )


if __name__ == "__main__":
    main()
