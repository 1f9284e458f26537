"""``archlab-average``'s work: the elementwise mean of a run's last k checkpoints (by step), the weights a
checkpoint average gives without training again (LAWA, Kaddour 2022; Sanyal et al. 2023)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from archlab import checks
from archlab.errors import ConfigError
from archlab.run_files import read_checkpoint

CHECKPOINTS = "checkpoints"  # where a run keeps them (conf/callbacks/default.yaml's dirpath)


def run_checkpoints(run: str | Path, field: str = "run") -> list[tuple[int, Path]]:
    """(step, file) of every checkpoint of the run directory ``run``, oldest first, each state once
    (``last.ckpt`` linking to a kept checkpoint is that checkpoint)."""
    directory = Path(run).expanduser() / CHECKPOINTS
    if not directory.is_dir():
        raise ConfigError(field, str(run), f"a run directory holding {CHECKPOINTS}/ (archlab-train writes them)")
    found: dict[Path, int] = {}
    for path in sorted(directory.glob("*.ckpt")):
        if path.name.startswith("."):  # a partial write (checkpoints.PARTIAL) or a swapped-out directory
            continue
        if path.resolve().is_dir():
            raise ConfigError(field, str(run), "a run checkpointed in single files; its checkpoints are sharded (FSDP)")
        step = read_checkpoint(path, field).get("global_step")
        if isinstance(step, int):
            found.setdefault(path.resolve(), step)
    by_step = {step: path for path, step in found.items()}
    return sorted(by_step.items())


def last_checkpoints(run: str | Path, k: int) -> list[Path]:
    """The run's ``k`` newest checkpoints, oldest first; ConfigError naming ``last`` where it holds fewer."""
    checks.integer("last", k)
    found = run_checkpoints(run)
    if k > len(found):
        steps = ", ".join(str(step) for step, _ in found) or "none"
        raise ConfigError(
            "last",
            k,
            f"at most the {len(found)} checkpoint(s) {run} holds (steps {steps}); "
            "to keep every checkpoint, train with callbacks.checkpoint.keep=all",
        )
    return [path for _, path in found[-k:]]


def mean_weights(paths: list[Path], field: str = "run") -> dict[str, Tensor]:
    """The elementwise mean of the model weights of the checkpoints ``paths`` (summed in float64, then in
    each tensor's own dtype); a tensor that is not floating point must be the same in all of them."""
    total: dict[str, Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path in paths:
        state = read_checkpoint(path, field)["state_dict"]
        model = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
        if total and model.keys() != total.keys():
            raise ConfigError(field, str(path), "checkpoints of one model (this one holds other tensors)")
        for name, value in model.items():
            dtypes[name] = value.dtype
            if not value.is_floating_point():
                if name in total and not torch.equal(total[name], value):
                    raise ConfigError(field, str(path), f"checkpoints whose {name} (not averaged) is the same")
                total[name] = value
            elif name in total:
                total[name] += value.double()
            else:
                total[name] = value.double()
    return {k: (v / len(paths)).to(dtypes[k]) if v.is_floating_point() else v for k, v in total.items()}
