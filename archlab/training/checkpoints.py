"""Checkpoint safety: writes that a kill cannot leave half done, and a check, before training starts,
that the checkpoint to continue from loads and was written for this run's model config.

Lightning's own writer goes through fsspec: a temporary file in the system temp directory, moved over
the target with ``shutil.move`` (a copy into the target when that directory is another filesystem),
and never fsynced. ``AtomicCheckpointIO`` writes beside the target, fsyncs, and renames.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.fabric.utilities.load import _METADATA_FILENAME
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import ModelParallelStrategy

from archlab.config import model_config_dict, recorded_model_config
from archlab.errors import ConfigError

# temporary names never end in ".ckpt", so resume=auto (newest *.ckpt) never picks a partial write
PARTIAL, OLD = ".partial", ".old"


def fsync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (POSIX: the directory entry itself must be synced)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` into a hidden temporary file in the target's directory, fsync it, ``os.replace`` it
    over the target, fsync the directory: a reader (or a resumed run) sees the old file or the new one."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        if not _is_local_file_protocol(path):  # object stores: their upload is already all-or-nothing
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}{PARTIAL}")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)  # after an error only; a kill leaves it, under a name no one reads
        fsync_dir(path.parent)


def replace_dir(staging: Path, path: Path) -> None:
    """Put the complete directory ``staging`` at ``path``. Two renames (a directory cannot be renamed over
    a non-empty one): a kill between them leaves ``path`` missing but both versions whole on disk."""
    old = path.with_name(f".{path.name}{OLD}")
    if old.exists():
        shutil.rmtree(old)
    if path.exists():
        os.replace(path, old)
    os.replace(staging, path)
    fsync_dir(path.parent)
    if old.is_dir():
        shutil.rmtree(old)
    elif old.exists():
        old.unlink()


class AtomicModelParallelStrategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2) whose sharded checkpoint directories appear whole or
    not at all: every rank writes its shard into a hidden staging directory, and once all ranks are done
    rank 0 swaps it in with ``replace_dir``. (The stock strategy rewrites ``last.ckpt``'s shards in place.)"""

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Optional[Any] = None) -> None:
        if not self._save_distributed_checkpoint:  # one consolidated file: written through AtomicCheckpointIO
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(filepath))
        staging = path.with_name(f".{path.name}{PARTIAL}")
        if self.global_rank == 0 and staging.exists():
            shutil.rmtree(staging)  # left by a run killed while saving
        self.barrier("archlab_ckpt_staging")
        super().save_checkpoint(checkpoint, staging, storage_options)
        self.barrier("archlab_ckpt_written")
        if self.global_rank == 0:
            replace_dir(staging, path)
        self.barrier("archlab_ckpt_replaced")


def read_checkpoint(path: str | Path, field: str) -> dict[str, Any]:
    """The checkpoint's non-tensor content (hyperparameters, loop state); tensors stay memory-mapped.
    A sharded (FSDP) checkpoint is a directory whose ``meta.pt`` holds that part."""
    path = Path(path)
    file = path / _METADATA_FILENAME if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(
            field, str(path), f"a checkpoint file, or a sharded checkpoint directory with {_METADATA_FILENAME}"
        )
    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # truncated, overwritten, not a torch file: torch's message says which
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            field,
            str(path),
            f"a complete checkpoint written by archlab-train; this one does not load ({type(err).__name__}: {reason})",
        ) from None


def _flatten(d: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for key, value in d.items():
        out.update(_flatten(value, f"{prefix}.{key}"))
    return out


def config_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "model") -> list[str]:
    """``"<field>: checkpoint <a>, this run <b>"`` for every leaf field whose values differ."""
    a, b = _flatten(saved, prefix), _flatten(current, prefix)
    missing = "(absent)"
    return [
        f"{k}: checkpoint {a.get(k, missing)!r}, this run {b.get(k, missing)!r}"
        for k in sorted(a.keys() | b.keys())
        if a.get(k, missing) != b.get(k, missing)
    ]


def check_checkpoint(
    path: Optional[str | Path],
    model: dict[str, Any],
    field: str = "ckpt_path",
    max_steps: Optional[int] = None,
    allow_done: bool = False,
) -> Optional[int]:
    """Refuse a checkpoint that does not load, that holds another model config than ``model``
    (``model_config_dict`` of this run), naming each differing field, or that has already trained
    ``max_steps`` steps (Lightning would stop at once and call it done; ``allow_done``: exactly
    ``max_steps`` is accepted, for ``resume=auto`` finishing its own run). Returns its step."""
    if path is None:
        return None
    checkpoint = read_checkpoint(path, field)
    saved = (checkpoint.get("hyper_parameters") or {}).get("model")
    if not isinstance(saved, dict):
        raise ConfigError(
            field, str(path), "a checkpoint written by archlab-train (it records no hyper_parameters.model)"
        )
    diffs = config_differences(model_config_dict(recorded_model_config(saved)), model)
    if diffs:
        raise ConfigError(field, str(path), "a checkpoint of this run's model; it differs in " + "; ".join(diffs))
    step = checkpoint.get("global_step")
    if max_steps is not None and max_steps > 0 and isinstance(step, int) and step >= max_steps + allow_done:
        raise ConfigError(
            "trainer.max_steps",
            max_steps,
            f"more than the {step} steps {path} has already trained "
            "(max_steps counts from the first step: raise it to train on)",
        )
    return step if isinstance(step, int) else None
