"""``data=tokens``: memory-mapped token shards in nanoGPT's format (``train.bin``, ``val.bin``: raw
little-endian uint16 or uint32 ids) with the ``meta.json`` that ``archlab-prepare`` writes beside them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np

from archlab import checks
from archlab.data.common import evaluation_only
from archlab.data.windows import WindowDataModule
from archlab.errors import ConfigError
from archlab.tokenizer import tokenizer_from_dict

DTYPES = ("uint16", "uint32")
SPLITS = ("train", "val")
META_KEYS = ("vocab_size", "dtype")
SCAN_CHUNK = 1 << 24  # ids per read while checking a shard's largest id


def read_meta(directory: Path) -> Optional[dict[str, Any]]:
    """``meta.json`` of a shard directory, or None when there is none; ConfigError when it is unreadable
    or lacks ``vocab_size`` or ``dtype``."""
    path = directory / "meta.json"
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError("data.dir", str(directory), f"a meta.json that is JSON ({path}: {err})") from None
    lacking = [k for k in META_KEYS if not isinstance(meta, dict) or k not in meta]
    if lacking:
        raise ConfigError(
            "data.dir",
            str(directory),
            f"a meta.json with {' and '.join(META_KEYS)} ({path} lacks "
            f"{', '.join(lacking)}; archlab-prepare writes both)",
        )
    vocab_size, dtype, eos_id = meta["vocab_size"], meta["dtype"], meta.get("eos_id")
    if isinstance(vocab_size, int) and dtype in DTYPES:
        check_capacity(vocab_size, dtype, "data.dir", str(directory), f"the dtype in {path}")
        if eos_id is not None and (
            isinstance(eos_id, bool) or not isinstance(eos_id, int) or not 0 <= eos_id < vocab_size
        ):
            raise ConfigError(
                "data.dir",
                str(directory),
                f"a meta.json whose eos_id is null or an id in [0, {vocab_size}) ({path} says eos_id={eos_id!r})",
            )
    return meta


def check_capacity(vocab_size: int, dtype: str, field: str, value: Any, where: str) -> None:
    """Shards of ``dtype`` hold ids below 2^bits: a larger vocabulary's ids would have wrapped around."""
    holds = 2 ** (8 * np.dtype(dtype).itemsize)
    if vocab_size > holds:
        raise ConfigError(
            field,
            value,
            f"a dtype that holds vocab_size={vocab_size} ids: {where} is {dtype}, which holds {holds} "
            "(uint32 shards for a larger vocabulary: archlab-prepare chooses it)",
        )


def largest_id(path: Path, dtype: np.dtype) -> int:
    """The largest token id in a shard, read in chunks (a sequential pass over the file, nothing kept)."""
    ids = np.memmap(path, dtype=dtype, mode="r")
    return max(int(ids[i : i + SCAN_CHUNK].max()) for i in range(0, len(ids), SCAN_CHUNK))


class TokensDataModule(WindowDataModule):
    """``train.bin``/``val.bin`` read through ``np.memmap``: nothing is loaded beyond the windows drawn.
    ``vocab_size`` and ``dtype`` come from ``meta.json``; give them only for shards without one
    (e.g. nanoGPT's own: ``data.vocab_size=50257 data.dtype=uint16``). ``document_mask`` keeps attention
    within the documents that ``eos_id`` (meta.json's, or given) separates, and ``reset_positions`` restarts
    positions at each document: ``documents`` tells the training module."""

    def __init__(
        self,
        dir: str,
        seq_len: int = 256,
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
        vocab_size: Optional[int] = None,
        dtype: Optional[str] = None,
        eval_seq_len: Optional[int] = None,
        document_mask: bool = False,
        reset_positions: bool = False,
        eos_id: Optional[int] = None,
    ):
        super().__init__(seq_len, batch_size, num_workers, seed, eval_seq_len)
        self.dir = Path(dir).expanduser()
        if not self.dir.is_dir():
            raise ConfigError(
                "data.dir", str(dir), "a directory holding train.bin and val.bin (archlab-prepare writes them)"
            )
        meta = read_meta(self.dir)
        self.tokenizer = None
        if meta is not None:
            for field, given in (("vocab_size", vocab_size), ("dtype", dtype)):
                if given is not None and given != meta[field]:
                    raise ConfigError(
                        f"data.{field}", given, f"null or {meta[field]!r}, the value in {self.dir / 'meta.json'}"
                    )
            vocab_size, dtype = meta["vocab_size"], meta["dtype"]
            self.tokenizer = tokenizer_from_dict(meta["tokenizer"]) if meta.get("tokenizer") else None
        elif vocab_size is None or dtype is None:
            raise ConfigError(
                "data.vocab_size" if vocab_size is None else "data.dtype",
                None,
                f"a value: {self.dir} has no meta.json, so give data.vocab_size and data.dtype",
            )
        checks.integer("data.vocab_size", vocab_size, 1, "an integer >= 1")
        assert vocab_size is not None  # checks.integer refuses anything but an int
        if dtype not in DTYPES:
            raise ConfigError("data.dtype", dtype, " | ".join(DTYPES))
        if meta is None:
            check_capacity(vocab_size, dtype, "data.dtype", dtype, "data.dtype")
        if meta is not None and evaluation_only(meta.get("val_fraction")):
            raise ConfigError(
                "data.dir",
                str(dir),
                "shards to train on: this is an evaluation-only preparation (val_fraction=1, val.bin alone); "
                f"evaluate on it with archlab-eval <run> perplexity={dir}",
            )
        self.vocab_size, self.dtype = vocab_size, np.dtype(dtype).newbyteorder("<")
        self.counts = {split: self.count_tokens(split) for split in SPLITS}
        if meta is not None:
            self.check_counts(meta)
        self.check_splits(self.counts["train"], self.counts["val"], str(self.dir), "data.dir")
        self.check_ids(from_meta=meta is not None)
        self.documents = self.document_handling(document_mask, reset_positions, eos_id, meta)

    def document_handling(
        self, mask: Any, reset_positions: Any, eos_id: Optional[int], meta: Optional[dict[str, Any]]
    ) -> Optional[dict[str, Any]]:
        """How the training module keeps attention within documents (None: it does not): ``eos_id`` ends
        each, and ``reset_positions`` restarts positions at each."""
        for field, value in (("data.document_mask", mask), ("data.reset_positions", reset_positions)):
            if not isinstance(value, bool):
                raise ConfigError(field, value, "true or false")
        if reset_positions and not mask:
            raise ConfigError(
                "data.reset_positions",
                True,
                "false unless data.document_mask=true (restarted positions with attention across documents "
                "would put a query before keys it sees)",
            )
        said = None if meta is None else meta.get("eos_id")
        if eos_id is not None:
            checks.integer("data.eos_id", eos_id, 0, f"null or an id in [0, {self.vocab_size})")
            if eos_id >= self.vocab_size:
                raise ConfigError("data.eos_id", eos_id, f"null or an id in [0, {self.vocab_size})")
            if said is not None and eos_id != said:
                raise ConfigError("data.eos_id", eos_id, f"null or {said!r}, the value in {self.dir / 'meta.json'}")
        eos_id = said if eos_id is None else eos_id
        if not mask:
            return None
        if eos_id is None:
            raise ConfigError(
                "data.eos_id",
                None,
                f"the id separating documents, for data.document_mask=true: {self.dir} has no eos_id in a "
                "meta.json (archlab-prepare writes it for a tokenizer with an EOS)",
            )
        return {"eos_id": eos_id, "reset_positions": reset_positions}

    def check_counts(self, meta: dict[str, Any]) -> None:
        """The shards hold as many ids as ``meta.json`` says (a mismatch: another dtype, or a cut-short copy)."""
        for split in SPLITS:
            said = meta.get(f"{split}_tokens")
            if said is not None and said != self.counts[split]:
                raise ConfigError(
                    "data.dir",
                    str(self.dir),
                    f"shards matching their meta.json: {split}.bin holds "
                    f"{self.counts[split]} {self.dtype.name} ids, meta.json says {said} (written "
                    "with another dtype, or truncated?)",
                )

    def check_ids(self, from_meta: bool) -> None:
        """Every id must be below ``vocab_size``: a larger one would index past the embedding table."""
        for split in SPLITS:
            top = largest_id(self.dir / f"{split}.bin", self.dtype)
            if top >= self.vocab_size:
                field = "data.dir" if from_meta else "data.vocab_size"
                value = str(self.dir) if from_meta else self.vocab_size
                raise ConfigError(
                    field,
                    value,
                    f"token ids below vocab_size={self.vocab_size}: {split}.bin holds id "
                    f"{top}"
                    + (
                        " (meta.json disagrees with its shards)"
                        if from_meta
                        else f" (data.vocab_size must be at least {top + 1})"
                    ),
                )

    def count_tokens(self, split: str) -> int:
        path = self.dir / f"{split}.bin"
        if not path.is_file():
            raise ConfigError("data.dir", str(self.dir), f"a directory with {path.name} (archlab-prepare writes it)")
        size = path.stat().st_size
        if size == 0 or size % self.dtype.itemsize:
            raise ConfigError(
                "data.dir",
                str(self.dir),
                f"a non-empty {path.name} of whole {self.dtype.name} ids (it has {size} bytes)",
            )
        return size // self.dtype.itemsize

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_data is None:
            self.train_data, self.val_data = (
                np.memmap(self.dir / f"{split}.bin", dtype=self.dtype, mode="r") for split in SPLITS
            )
