"""Checkpoint safety: writes that a kill cannot leave half done, ``last.ckpt`` as a link rather than a second
copy, and a check, before training starts, that the checkpoint to continue from loads and was written for
this run's model config.

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
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import Tensor

from archlab.config import model_config_dict, recorded_model_config, to_model_config
from archlab.errors import ConfigError
from archlab.nn.validation import without_ignored
from archlab.run_files import read_checkpoint
from archlab.training.outputs import LAST, check_keep

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


def _remove(path: Path) -> None:
    """Delete a file, a link (never what it points at) or a directory tree; nothing if absent."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def replace_dir(staging: Path, path: Path) -> None:
    """Put the complete directory (or link) ``staging`` at ``path``. Two renames (nothing can be renamed over
    a directory): a kill between them leaves ``path`` missing but both versions whole on disk."""
    old = path.with_name(f".{path.name}{OLD}")
    _remove(old)
    if path.exists() or path.is_symlink():
        os.replace(path, old)
    os.replace(staging, path)
    fsync_dir(path.parent)
    _remove(old)


def link_checkpoint(target: Path, link: Path) -> None:
    """Make ``link`` a relative symbolic link to the checkpoint ``target`` (the run directory may move) in
    one rename over what was there, so a reader finds the previous checkpoint or the new one; a sharded
    checkpoint directory in the way is swapped out by ``replace_dir``."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}{PARTIAL}")
    _remove(tmp)
    os.symlink(os.path.relpath(target, link.parent), tmp)
    if link.is_dir() and not link.is_symlink():
        replace_dir(tmp, link)
    else:
        os.replace(tmp, link)
        fsync_dir(link.parent)


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` whose ``last.ckpt`` always holds the newest checkpointed state (what
    ``resume=auto`` continues from) without a second copy of a kept file: it links to the checkpoint just
    written, and is a file of its own only for a step whose checkpoint is not kept (not among the best).
    ``keep`` (``outputs.KEEP``) says what else stays: ``best_and_last``, the ``save_top_k`` best by
    ``monitor``; ``all``, every checkpoint; ``last``, none."""

    def __init__(self, keep: str = "best_and_last", save_top_k: int = 1, **kwargs: Any):
        check_keep(keep, save_top_k)
        self.keep = keep
        top_k = {"best_and_last": save_top_k, "all": -1, "last": 0}[keep]
        super().__init__(save_top_k=top_k, save_last=True, **kwargs)

    def _last_path(self) -> str:
        assert self.dirpath is not None  # resolved in setup, before any save
        return os.path.join(self.dirpath, LAST)

    def _save_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        last = self._last_path()
        self.last_model_path = last  # recorded in every checkpoint's state
        super()._save_checkpoint(trainer, filepath)
        if filepath == last:
            return
        if not _is_local_file_protocol(last):  # an object store has no links: a copy
            super()._save_checkpoint(trainer, last)
            return
        if trainer.is_global_zero:
            link_checkpoint(Path(filepath), Path(last))
        trainer.strategy.barrier("archlab_last_linked")

    def _save_topk_checkpoint(self, trainer: Trainer, monitor_candidates: dict[str, Tensor]) -> None:
        if self.keep != "last":
            super()._save_topk_checkpoint(trainer, monitor_candidates)
        if self._last_global_step_saved != trainer.global_step:  # this step's state is in no kept file
            self._save_checkpoint(trainer, self._last_path())

    def _save_last_checkpoint(self, trainer: Trainer, monitor_candidates: dict[str, Tensor]) -> None:
        if self._last_global_step_saved != trainer.global_step:  # at the end of fit, or on an exception
            self._save_checkpoint(trainer, self._last_path())


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


def loadable_before(path: Path) -> Optional[Path]:
    """The newest other checkpoint in ``path``'s directory that loads (a link to ``path`` passed over):
    the one a run whose ``path`` was cut short can continue from."""
    bad = path.resolve()
    others = [p for p in path.parent.glob("*.ckpt") if p.exists() and p.resolve() != bad]
    for other in sorted(others, key=lambda p: p.stat().st_mtime_ns, reverse=True):
        try:
            read_checkpoint(other, "ckpt_path")
        except ConfigError:
            continue
        return other
    return None


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
    try:
        checkpoint = read_checkpoint(path, field)
    except ConfigError as err:
        earlier = loadable_before(Path(path)) if Path(path).exists() else None
        if earlier is None:
            raise
        raise ConfigError(
            err.field,
            err.value,
            f"{err.allowed}; the newest checkpoint beside it that loads is {earlier} (ckpt_path={earlier})",
        ) from None
    saved = (checkpoint.get("hyper_parameters") or {}).get("model")
    if not isinstance(saved, dict):
        raise ConfigError(
            field, str(path), "a checkpoint written by archlab-train (it records no hyper_parameters.model)"
        )
    # fields the variant ignores are no part of the model (earlier presets set some: rmsnorm's bias)
    diffs = config_differences(
        model_config_dict(without_ignored(recorded_model_config(saved))),
        model_config_dict(without_ignored(to_model_config(model))),
    )
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
