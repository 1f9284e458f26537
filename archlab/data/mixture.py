"""``data=mixture``: several ``archlab-prepare`` shard directories with one tokenizer, sampled by weight.

``mixture`` maps a name to ``{dir, weight}``; weights are relative (3 and 1 are 3/4 and 1/4). Batch ``k``
gives each source the rows ``archlab.data.allocation`` allocates it (``floor`` or ``ceil`` of its share of
the batch), each a window at a uniform random offset of that source's ``train.bin``, the rows then in a
seeded random order (so each process of a data-parallel run gets a mix): a pure function of
``(seed, k)``, as every training stream here. Validation scores each source's ``val.bin`` apart
(``val/<name>``) and all of them together (``val``: every validation token of every source, once, the
same set whatever the weights).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, cast

import lightning as L
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from archlab import checks
from archlab.data.allocation import Allocation
from archlab.data.mixture_counts import MixtureCounts
from archlab.data.stream import BatchStream, batch_rng, eval_loader, stream_loader
from archlab.data.tokens import TokensDataModule, read_meta
from archlab.data.windows import ValidationWindows, random_windows
from archlab.errors import ConfigError
from archlab.tokenizer import tokenizer_from_dict

NAME = re.compile(r"[A-Za-z0-9_-]+")  # a source's name is a metric's path part: val/<name>/loss
FIELDS = ("dir", "weight")


@dataclass(frozen=True)
class Source:
    """One entry of ``data.mixture``: its name, shard directory and relative weight."""

    name: str
    dir: Path
    weight: float

    @property
    def field(self) -> str:
        return f"data.mixture.{self.name}"


def sources(mixture: Any) -> list[Source]:
    """The entries of ``data.mixture``, by name; ConfigError naming the first field that cannot work."""
    if isinstance(mixture, DictConfig):
        mixture = OmegaConf.to_container(mixture, resolve=True)
    allowed = "a mapping of names to {dir: <an archlab-prepare directory>, weight: <a positive number>}"
    if not isinstance(mixture, dict) or not mixture:
        raise ConfigError("data.mixture", mixture, allowed)
    found = []
    for name, entry in sorted(mixture.items(), key=lambda item: str(item[0])):
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ConfigError("data.mixture", name, "names of letters, digits, _ and - (each names val/<name>/loss)")
        field = f"data.mixture.{name}"
        if not isinstance(entry, dict):
            raise ConfigError(field, entry, "{dir: <an archlab-prepare directory>, weight: <a positive number>}")
        for key in entry:
            if key not in FIELDS:
                raise ConfigError(f"{field}.{key}", entry[key], f"a field of a mixture's source: {', '.join(FIELDS)}")
        for key in FIELDS:
            if entry.get(key) is None:
                raise ConfigError(f"{field}.{key}", None, "a value (each source has a dir and a weight)")
        checks.positive(
            f"{field}.weight", entry["weight"], "a positive number (weights are relative: 3 and 1 give 3/4 and 1/4)"
        )
        found.append(Source(name, Path(str(entry["dir"])).expanduser(), float(entry["weight"])))
    seen: dict[Path, str] = {}
    for s in found:
        if not s.dir.is_dir():
            raise ConfigError(
                f"{s.field}.dir",
                str(s.dir),
                "a directory holding train.bin, val.bin and meta.json (archlab-prepare writes them)",
            )
        other = seen.setdefault(s.dir.resolve(), s.name)
        if other != s.name:
            raise ConfigError(f"{s.field}.dir", str(s.dir), f"a directory no other source names ({other} names it)")
    return found


def describe_tokenizer(meta: dict[str, Any]) -> str:
    """A tokenizer as an error names it: its kind, size, the file a pretrained one came from, and the start
    of its JSON's SHA-256 (two char vocabularies of one size differ there)."""
    spec = meta["tokenizer"]
    kind = spec.get("kind") if isinstance(spec, dict) else spec
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    file = meta.get("tokenizer_file")
    origin = f", from {file['path']}" if isinstance(file, dict) and file.get("path") else ""
    return f"{kind} ({meta['vocab_size']} ids{origin}, sha256 {digest})"


def source_metas(found: list[Source]) -> list[dict[str, Any]]:
    """Each source's ``meta.json``, once sure they share one tokenizer (ConfigError naming the first source
    that does not, beside the first source's): read before any shard is."""
    metas = []
    for s in found:
        try:
            meta = read_meta(s.dir)
        except ConfigError as err:
            raise ConfigError(f"{s.field}.dir", err.value, err.allowed) from None
        if meta is None or not meta.get("tokenizer"):
            raise ConfigError(
                f"{s.field}.dir",
                str(s.dir),
                "a directory archlab-prepare wrote, with a meta.json naming its tokenizer (a mixture's sources "
                "must share one tokenizer, so each must say which)",
            )
        metas.append(meta)
    first, first_meta = found[0], metas[0]
    for s, meta in zip(found[1:], metas[1:]):
        if meta["tokenizer"] != first_meta["tokenizer"] or meta["vocab_size"] != first_meta["vocab_size"]:
            raise ConfigError(
                f"{s.field}.dir",
                str(s.dir),
                f"shards made with the tokenizer of source {first.name}: {s.name} was made with "
                f"{describe_tokenizer(meta)}, {first.name} with {describe_tokenizer(first_meta)} (archlab-prepare "
                f"this source again with that tokenizer)",
            )
    return metas


class MixtureBatches:
    """Global batch ``index`` of a mixture: each source's allocated rows of windows, in a seeded order."""

    def __init__(self, train: list[Any], weights: list[float], seq_len: int, seed: int):
        self.train, self.weights, self.seq_len, self.seed = train, weights, seq_len, seed
        self.allocations: dict[int, Allocation] = {}

    def allocation(self, rows: int) -> Allocation:
        """The allocation of batches of ``rows`` rows (every process's), made once."""
        if rows not in self.allocations:
            self.allocations[rows] = Allocation(self.weights, rows, self.seed)
        return self.allocations[rows]

    def __call__(self, rng: np.random.Generator, n: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        counts = self.allocation(n).rows_of(index)
        parts = [random_windows(rng, int(c), data, self.seq_len) for c, data in zip(counts, self.train)]
        order = torch.from_numpy(rng.permutation(n))
        return torch.cat([p[0] for p in parts])[order], torch.cat([p[1] for p in parts])[order]


class MixtureStream(BatchStream):
    """The training stream of a mixture: its batch function is given the batch's index as well."""

    def global_batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        batches = cast(MixtureBatches, self.make_batch)
        return batches(batch_rng(self.seed, 0, index), self.world_size * self.batch_size, index)


class MixtureDataModule(L.LightningDataModule):
    """Sources of one tokenizer, each checked as ``data=tokens`` checks its directory, sampled by weight.
    ``val_names`` lists ``val`` (every source's validation windows) and ``val/<name>`` for each source;
    ``val_pools`` tells the training module that ``val`` pools the others' batches rather than having a
    loader of its own. ``callbacks`` holds the one that logs and records each source's realised tokens."""

    chance_accuracy = None

    def __init__(
        self,
        mixture: Any,
        seq_len: int = 256,
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
        document_mask: bool = False,
        reset_positions: bool = False,
        eos_id: Optional[int] = None,
    ):
        super().__init__()
        checks.integer("data.seq_len", seq_len, 1, "an integer >= 1")
        checks.integer("data.batch_size", batch_size, 1, "an integer >= 1")
        checks.integer("data.num_workers", num_workers, 0, "an integer >= 0")
        self.sources = sources(mixture)
        metas = source_metas(self.sources)
        shared = {"seq_len": seq_len, "batch_size": batch_size, "num_workers": num_workers, "seed": seed}
        documents = {"document_mask": document_mask, "reset_positions": reset_positions, "eos_id": eos_id}
        self.parts = [self.source_data(s, **shared, **documents) for s in self.sources]
        self.documents = self.parts[0].documents
        for s, part in zip(self.sources[1:], self.parts[1:]):
            if part.documents != self.documents:  # one tokenizer, but prepared with another eos=
                eos, theirs = (d["eos_id"] if d else None for d in (self.documents, part.documents))
                raise ConfigError(
                    f"{s.field}.dir",
                    str(s.dir),
                    f"shards whose documents end with id {eos}, as source {self.sources[0].name}'s do (its "
                    f"meta.json's eos_id is {theirs}: archlab-prepare the sources with one eos=)",
                )
        self.seq_len, self.batch_size, self.num_workers, self.seed = seq_len, batch_size, num_workers, seed
        self.vocab_size, self.max_seq_len = int(metas[0]["vocab_size"]), seq_len
        self.tokenizer = tokenizer_from_dict(metas[0]["tokenizer"])
        self.val_names = ["val", *(f"val/{s.name}" for s in self.sources)]
        self.val_pools = {"val": self.val_names[1:]}
        self.batches: Optional[MixtureBatches] = None
        self.callbacks = [
            MixtureCounts(
                [s.name for s in self.sources],
                [s.dir for s in self.sources],
                self.weights,
                [part.counts["train"] for part in self.parts],
                seq_len,
                batch_size,
                seed,
            )
        ]

    @staticmethod
    def source_data(s: Source, **settings: Any) -> TokensDataModule:
        """Source ``s`` checked as ``data=tokens`` checks a directory (an error naming its ``dir``)."""
        try:
            return TokensDataModule(str(s.dir), **settings)
        except ConfigError as err:
            if err.field != "data.dir":
                raise
            raise ConfigError(f"{s.field}.dir", err.value, err.allowed) from None

    @property
    def weights(self) -> list[float]:
        return [s.weight for s in self.sources]

    def setup(self, stage: Optional[str] = None) -> None:
        self.train_batches()

    def train_batches(self) -> MixtureBatches:
        """The training stream's batch function, over the sources' memory-mapped ``train.bin`` (mapped once)."""
        if self.batches is None:
            for part in self.parts:
                part.setup()
            self.batches = MixtureBatches([p.train_data for p in self.parts], self.weights, self.seq_len, self.seed)
        return self.batches

    def train_dataloader(self):
        batches = self.train_batches()
        return stream_loader(batches, self.seed, self.batch_size, self.num_workers, self.trainer, stream=MixtureStream)

    def val_dataloader(self):
        self.setup("validate")
        return [
            eval_loader(ValidationWindows(p.val_data, self.seq_len), self.batch_size, self.num_workers, self.trainer)
            for p in self.parts
        ]
