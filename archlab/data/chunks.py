"""A corpus tokenised into nanoGPT shards chunk by chunk, in worker processes, so that an interrupted run
continues where it stopped: each chunk of ``chunk_documents`` documents is written to ``partial/`` in the
output directory with a record of its counts, ``progress.json`` holds the settings that fix the output,
and the shards are the chunks joined in order (the same bytes for any number of workers)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timezone
from fractions import Fraction
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from archlab.data.common import evaluation_only
from archlab.data.corpus import Corpus
from archlab.errors import ConfigError

PARTIAL = "partial"  # the chunks written so far
PROGRESS = "progress.json"  # the settings of the run the chunks belong to
SPLITS = ("train", "val")
PARALLELISM = "TOKENIZERS_PARALLELISM"  # the tokenizers library's switch for its own threads
IN_FLIGHT = 2  # chunks queued per worker: enough to keep each busy, few enough to bound memory


@dataclass
class Plan:
    """What the chunks need: where they go, the tokenizer as JSON, the EOS id, the dtype and the split."""

    out: Path
    tokenizer_json: str
    eos_id: int
    dtype: str
    val_fraction: float
    chunk_documents: int


def validation_documents(documents: int, val_fraction: float) -> int:
    """How many of ``documents`` validate: ``floor(documents * val_fraction)``, in exact arithmetic."""
    share = Fraction(repr(val_fraction))
    return documents * share.numerator // share.denominator


def is_validation(index: int, share: Fraction) -> bool:
    """Document ``index`` validates where ``floor((index + 1) * share)`` steps up: the validation documents
    are spread evenly through the corpus (one in ten at 0.1: documents 9, 19, 29, ...)."""
    return (index + 1) * share.numerator // share.denominator > index * share.numerator // share.denominator


def input_state(files: list[Path], documents: int) -> dict[str, Any]:
    """The input as ``progress.json`` records it: each file's path, size and modification time (an edit
    that keeps the document count still changes these), and the document count."""
    return {
        "files": [
            {"path": str(f.resolve()), "bytes": f.stat().st_size, "mtime_ns": f.stat().st_mtime_ns} for f in files
        ],
        "documents": documents,
    }


def changed_input(out: Path, earlier: Any, now: dict[str, Any]) -> ConfigError:
    """The error for an input that is not the one the interrupted run in ``out`` read: the first file
    edited, added or removed since."""
    restart = f"the file restored, or {out / PROGRESS} deleted to start afresh"
    files = earlier.get("files") if isinstance(earlier, dict) else None
    before = {f.get("path"): f for f in files if isinstance(f, dict)} if isinstance(files, list) else {}
    after = {f["path"]: f for f in now["files"]}
    if not before:  # a record of an older archlab-prepare: the paths alone
        return ConfigError(
            "input",
            str(sorted(after)),
            f"the input of the interrupted run that {out} holds, which its {PROGRESS} does not record "
            f"(an older archlab-prepare wrote it): {out / PROGRESS} deleted to start afresh",
        )
    changed = next((p for p in sorted(before.keys() | after.keys(), key=str) if before.get(p) != after.get(p)), None)
    if changed is None:  # the same files, read as another number of documents
        return ConfigError(
            "input",
            str(sorted(after)),
            f"the input of the interrupted run that {out} holds, unchanged: it held {earlier.get('documents')} "
            f"documents, now {now['documents']}; {out / PROGRESS} deleted to start afresh",
        )
    then, since = (
        "absent" if f is None else f"{f['bytes']} bytes, modified {modified(f['mtime_ns'])}"
        for f in (before.get(changed), after.get(changed))
    )
    return ConfigError(
        "input",
        changed,
        f"the input of the interrupted run that {out} holds, unchanged, to continue it: this file was {then} "
        f"then and is {since} now; {restart}",
    )


def modified(mtime_ns: int) -> str:
    """A modification time in nanoseconds as an ISO date and time (UTC, to the microsecond)."""
    return datetime.fromtimestamp(mtime_ns / 1e9, timezone.utc).isoformat(timespec="microseconds")


def begin(out: Path, identity: dict[str, Any]) -> bool:
    """Record ``identity`` (the settings that fix the output, by field; ``input`` as ``input_state`` gives it)
    in ``progress.json``; True when an earlier run with the same settings and unchanged input files left
    chunks to continue from. Settings that differ from that run's are a ConfigError naming the first such
    field, an input file edited since a ConfigError naming the file."""
    progress = out / PROGRESS
    if progress.is_file():
        earlier = json.loads(progress.read_text())
        for field, value in identity.items():
            if earlier.get(field) != value:
                if field == "input":
                    raise changed_input(out, earlier.get(field), value)
                raise ConfigError(
                    field,
                    value,
                    f"the setting of the interrupted run that {out} holds ({earlier.get(field)!r}), to continue it; "
                    f"or another output directory, or {progress} deleted to start afresh",
                )
        return True
    shutil.rmtree(out / PARTIAL, ignore_errors=True)  # chunks without a record of their settings: not ours
    out.mkdir(parents=True, exist_ok=True)
    progress.write_text(json.dumps(identity, indent=1))
    return False


_WORKER: dict[str, Any] = {}  # the tokenizer and plan a worker process (or this one) encodes with


def start_worker(plan: Plan) -> None:
    """Load the tokenizer once per process."""
    from tokenizers import Tokenizer

    _WORKER.update(tok=Tokenizer.from_str(plan.tokenizer_json), plan=plan)


@contextlib.contextmanager
def one_thread_each() -> Iterator[None]:
    """The tokenizers library on one thread in this process and those it starts: ``workers`` alone sets the
    parallelism (on a busy machine the library's own threads only compete with each other)."""
    previous = os.environ.get(PARALLELISM)
    os.environ[PARALLELISM] = "false"  # read by the library at each batch, and at a fork
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(PARALLELISM, None)
        else:
            os.environ[PARALLELISM] = previous


def worker_pool(plan: Plan, workers: int) -> ProcessPoolExecutor:
    """``workers`` processes, each with the tokenizer loaded: forked where the platform allows, so that a
    worker starts without importing archlab (and torch) again."""
    method = "fork" if sys.platform == "linux" else "spawn"
    return ProcessPoolExecutor(workers, get_context(method), initializer=start_worker, initargs=(plan,))


def encode_chunk(index: int, texts: list[str], validation: list[bool]) -> tuple[int, dict[str, int]]:
    """Encode one chunk's documents, each followed by EOS, into its train and val parts in ``partial/``;
    the record of its counts is written last, so a chunk with a record is whole."""
    plan: Plan = _WORKER["plan"]
    ids: dict[bool, list[int]] = {False: [], True: []}
    for encoding, val in zip(_WORKER["tok"].encode_batch(texts, add_special_tokens=False), validation):
        ids[val].extend(encoding.ids)
        ids[val].append(plan.eos_id)
    partial = plan.out / PARTIAL
    for split, val in zip(SPLITS, (False, True)):
        np.asarray(ids[val], dtype=np.dtype(plan.dtype).newbyteorder("<")).tofile(partial / f"{index:06d}.{split}.bin")
    record = {
        "train_documents": validation.count(False),
        "val_documents": validation.count(True),
        "train_tokens": len(ids[False]),
        "val_tokens": len(ids[True]),
    }
    written = partial / f"{index:06d}.json.tmp"
    written.write_text(json.dumps(record))
    os.replace(written, partial / f"{index:06d}.json")
    return index, record


def chunk_tasks(corpus: Corpus, plan: Plan, done: set[int]) -> Iterator[tuple[int, list[str], list[bool]]]:
    """The chunks not yet done: their index, texts and which documents validate."""
    share = Fraction(repr(plan.val_fraction))
    size = plan.chunk_documents

    def chunk(index: int, texts: list[str]) -> tuple[int, list[str], list[bool]]:
        return index, texts, [is_validation(index * size + i, share) for i in range(len(texts))]

    texts: list[str] = []
    index = 0
    for text in corpus.texts():
        texts.append(text)
        if len(texts) == size:
            if index not in done:
                yield chunk(index, texts)
            texts, index = [], index + 1
    if texts and index not in done:
        yield chunk(index, texts)


def write_shards(corpus: Corpus, plan: Plan, workers: int) -> dict[str, int]:
    """Tokenise the chunks not yet done (in ``workers`` processes), then join every chunk into
    ``train.bin`` and ``val.bin``; returns the document and token counts of each split."""
    from tqdm import tqdm

    partial = plan.out / PARTIAL
    partial.mkdir(parents=True, exist_ok=True)
    records = {int(p.name.split(".")[0]): json.loads(p.read_text()) for p in partial.glob("*.json")}
    tasks = chunk_tasks(corpus, plan, set(records))
    done = sum(r["train_documents"] + r["val_documents"] for r in records.values())
    with contextlib.ExitStack() as stack:
        stack.enter_context(one_thread_each())
        pool = None if workers == 1 else stack.enter_context(worker_pool(plan, workers))
        bar = stack.enter_context(
            tqdm(total=corpus.documents, initial=done, unit="doc", desc="tokenising", disable=None)
        )  # after the pool: forking a process that runs tqdm's monitor thread is unsafe

        def finished(index: int, record: dict[str, int]) -> None:
            records[index] = record
            bar.update(record["train_documents"] + record["val_documents"])

        if pool is None:
            start_worker(plan)
            for task in tasks:
                finished(*encode_chunk(*task))
        else:
            pending: set[Future] = set()
            for task in tasks:
                pending.add(pool.submit(encode_chunk, *task))
                if len(pending) >= IN_FLIGHT * workers:
                    complete, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in complete:
                        finished(*future.result())
            for future in wait(pending).done:
                finished(*future.result())
    for split in SPLITS[1:] if evaluation_only(plan.val_fraction) else SPLITS:  # no train.bin
        joined = plan.out / f"{split}.bin.tmp"
        with joined.open("wb") as sink:
            for index in sorted(records):
                with (partial / f"{index:06d}.{split}.bin").open("rb") as part:
                    shutil.copyfileobj(part, sink)
        os.replace(joined, plan.out / f"{split}.bin")
    keys = ("train_documents", "val_documents", "train_tokens", "val_tokens")
    return {key: sum(r[key] for r in records.values()) for key in keys}


def finish(out: Path) -> None:
    """The run is complete (shards and meta.json written): drop the chunks and the progress record."""
    shutil.rmtree(out / PARTIAL, ignore_errors=True)
    (out / PROGRESS).unlink(missing_ok=True)


def default_workers(workers: Optional[int]) -> int:
    """``workers``, or the CPUs this process may use, at most 8 (tokenising is rarely worth more here)."""
    if workers is not None:
        return workers
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
