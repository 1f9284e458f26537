"""Structured configs of ``archlab-train`` (types, checked by Hydra at compose time) and
``validate_train`` (values, checked before any data is read or weight allocated)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf

from archlab.config import to_model_config
from archlab.config.train import world_size
from archlab.errors import ConfigError, SweepConfigError
from archlab.nn.validation import validate

PRECISIONS = ("32", "32-true", "bf16-mixed", "bf16-true", "16-mixed")
ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "auto")
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_notebook", "fsdp", "deepspeed")
SCHEDULES = ("cosine",)


def _positive_int(value: Any, name: str, allow_zero: bool = False) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if allow_zero else 1):
        raise ConfigError(name, value, "a non-negative integer" if allow_zero else "a positive integer")


def _choice(value: Any, name: str, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(name, value, "one of " + ", ".join(allowed))


def _target(node: Any, name: str) -> None:
    if not isinstance(node, (dict, DictConfig)) or "_target_" not in node:
        raise ConfigError(name, node, "a config node with a _target_ (the class to instantiate)")


def _relaunches_command(t: Any) -> bool:
    """Does Lightning start this trainer's extra processes by re-running the command line?
    (ddp and ModelParallelStrategy do; ddp_spawn and friends start them in-process.)"""
    if t.devices == "auto" or (len(t.devices) if isinstance(t.devices, ListConfig) else t.devices) == 1:
        return False
    if isinstance(t.strategy, str):
        return t.strategy not in ("auto", "ddp_spawn", "ddp_notebook", "ddp_fork")
    return t.strategy.get("start_method", "popen") == "popen"


def _check_sweep(t: Any) -> None:
    """Inside a local ``-m`` sweep, a re-run command line would re-run the whole sweep in every process."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    if "submitit" in str(HydraConfig.get().launcher.get("_target_", "")):
        return  # SLURM starts every process itself
    if _relaunches_command(t):
        raise SweepConfigError(
            "trainer.strategy",
            t.strategy if isinstance(t.strategy, str) else t.strategy._target_,
            "in a -m sweep: trainer=ddp_spawn (processes spawned in-process), or "
            "hydra/launcher=slurm (one job per run); ddp/fsdp re-run the command, i.e. the sweep",
        )


def _check_direction(cfg: DictConfig) -> None:
    """An optimising sweeper (Optuna) must maximise an accuracy objective and minimise a loss or perplexity:
    the other way round it would hunt for the worst run, and every trial would look fine."""
    from hydra.core.hydra_config import HydraConfig

    sweeper = HydraConfig.get().sweeper if HydraConfig.initialized() else OmegaConf.select(cfg, "hydra.sweeper")
    direction = sweeper.get("direction") if sweeper is not None else None
    if not isinstance(direction, str):  # no optimising sweeper (or a multi-objective list)
        return
    objective = OmegaConf.select(cfg, "objective") or "val/loss"
    wanted = "maximize" if objective.endswith("/acc") else "minimize"
    if direction != wanted:
        raise SweepConfigError(
            "hydra.sweeper.direction",
            direction,
            f"{wanted} for objective={objective} (accuracy: maximize; loss and ppl: minimize)",
        )


def validate_train(cfg: DictConfig) -> DictConfig:
    """Raise one ConfigError naming the first bad training setting; return ``cfg``, unchanged but for a
    warm-up the command line did not set, fitted to a shorter run (``fit_warmup``).

    Runs before the data is read: the model is checked with the sizes it was composed with (the data
    later replaces vocab_size and context_length, and the model is checked again then)."""
    t = cfg.trainer
    _choice(str(t.precision), "trainer.precision", PRECISIONS)
    _choice(t.accelerator, "trainer.accelerator", ACCELERATORS)
    if isinstance(t.strategy, str):
        _choice(t.strategy, "trainer.strategy", STRATEGIES)
    else:
        _target(t.strategy, "trainer.strategy")
        if str(t.strategy._target_).endswith("ModelParallelStrategy"):
            world_size(t.devices, t.num_nodes)  # the FSDP mesh is sized from them
    if not (t.devices == "auto" or isinstance(t.devices, (int, ListConfig, list))) or (
        isinstance(t.devices, int) and t.devices < 1
    ):
        raise ConfigError("trainer.devices", t.devices, 'a positive integer, a list of device ids, or "auto"')
    _check_sweep(t)
    _check_direction(cfg)
    _positive_int(t.num_nodes, "trainer.num_nodes")
    _positive_int(t.max_steps, "trainer.max_steps")
    _positive_int(t.val_check_interval, "trainer.val_check_interval")
    _positive_int(t.accumulate_grad_batches, "trainer.accumulate_grad_batches")
    _positive_int(t.log_every_n_steps, "trainer.log_every_n_steps")
    _positive_int(t.num_sanity_val_steps, "trainer.num_sanity_val_steps", allow_zero=True)
    if t.gradient_clip_val is not None and not _finite(t.gradient_clip_val) > 0:
        raise ConfigError(
            "trainer.gradient_clip_val", t.gradient_clip_val, "a positive number, or null for no clipping"
        )
    if t.check_val_every_n_epoch is not None:
        _positive_int(t.check_val_every_n_epoch, "trainer.check_val_every_n_epoch")
    v = t.limit_val_batches
    if v is not None and not (isinstance(v, int) and v >= 1 or isinstance(v, float) and 0.0 < v <= 1.0):
        raise ConfigError(
            "trainer.limit_val_batches", v, "null (all), a number of batches >= 1, or a fraction in (0, 1]"
        )
    if t.max_time is not None and not re.fullmatch(r"\d+:\d+:\d+:\d+", str(t.max_time)):
        raise ConfigError("trainer.max_time", t.max_time, 'null or a duration "DD:HH:MM:SS", e.g. "00:12:00:00"')
    _check_hardware(t)

    o = cfg.optim
    check_arguments(o, "optim", "params")  # e.g. optim._target_=torch.optim.SGD takes no betas
    if not _finite(o.lr) > 0:
        raise ConfigError("optim.lr", o.lr, "a positive number")
    if len(o.betas) != 2 or not all(0.0 <= b < 1.0 for b in o.betas):
        raise ConfigError("optim.betas", list(o.betas), "two numbers in [0, 1)")
    if not _finite(o.eps) > 0:
        raise ConfigError(
            "optim.eps", o.eps, "a positive number (it keeps AdamW's update finite where a gradient is 0)"
        )
    if not _finite(o.weight_decay) >= 0:
        raise ConfigError("optim.weight_decay", o.weight_decay, "a non-negative number")

    s = cfg.scheduler
    _choice(s.kind, "scheduler.kind", SCHEDULES)
    _positive_int(s.warmup_steps, "scheduler.warmup_steps", allow_zero=True)
    if not 0.0 <= s.min_lr_ratio <= 1.0:
        raise ConfigError(
            "scheduler.min_lr_ratio", s.min_lr_ratio, "a number in [0, 1] (the floor as a fraction of optim.lr)"
        )
    from archlab.training.optim import fit_warmup

    fit_warmup(cfg)  # a warm-up not set on the command line is shortened to fit the run
    if s.decay_steps is None and s.warmup_steps >= t.max_steps:
        raise ConfigError(
            "scheduler.warmup_steps",
            s.warmup_steps,
            f"fewer than trainer.max_steps={t.max_steps} (the cosine decays until then)",
        )
    decay = s.decay_steps if s.decay_steps is not None else t.max_steps
    if decay <= s.warmup_steps:
        raise ConfigError("scheduler.decay_steps", decay, f"more than scheduler.warmup_steps={s.warmup_steps}")

    _target(cfg.data, "data")
    for group in ("logger", "callbacks"):
        for name, node in (cfg[group] or {}).items():
            if node is not None:
                _target(node, f"{group}.{name}")
    if cfg.resume not in (None, "auto"):
        raise ConfigError("resume", cfg.resume, 'null or "auto" (the newest checkpoint of this run directory)')
    if cfg.ckpt_path is not None and cfg.resume is not None:
        raise ConfigError("resume", cfg.resume, "null when ckpt_path is given (they both pick the checkpoint)")
    if cfg.ckpt_path is not None and not Path(cfg.ckpt_path).exists():
        raise ConfigError("ckpt_path", cfg.ckpt_path, "an existing checkpoint file (or sharded checkpoint directory)")
    if cfg.threads is not None:
        _positive_int(cfg.threads, "threads")
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or not 0 <= cfg.seed < 2**32:
        raise ConfigError("seed", cfg.seed, "an integer in [0, 2**32) (what numpy and torch accept as a seed)")
    _check_checkpoint_callback((cfg.callbacks or {}).get("checkpoint"))
    _check_output_dir(cfg.paths.output_dir)
    validate(to_model_config(cfg.model))
    return cfg


def _finite(value: Any) -> float:
    """``value`` as a float when it is a finite number, else NaN (which fails every comparison)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return math.nan
    return float(value)


def _check_hardware(t: Any) -> None:
    """Devices this machine has: Lightning would fail (no GPU) or silently change the run (fp16 on a CPU)."""
    if t.accelerator in ("gpu", "cuda"):
        import torch

        have = torch.cuda.device_count()
        if have == 0:
            raise ConfigError("trainer.accelerator", t.accelerator, "cpu or auto: this machine has no CUDA GPU")
        wanted = list(t.devices) if isinstance(t.devices, ListConfig) else t.devices
        if isinstance(wanted, int) and wanted > have or isinstance(wanted, list) and max(wanted) >= have:
            raise ConfigError(
                "trainer.devices", wanted, f'at most {have} GPU(s) on this machine (ids 0..{have - 1}), or "auto"'
            )
    if t.accelerator == "cpu":
        if isinstance(t.devices, ListConfig):
            raise ConfigError(
                "trainer.devices", list(t.devices), "a number of processes for accelerator=cpu (ids are for GPUs)"
            )
        if str(t.precision) == "16-mixed":
            raise ConfigError(
                "trainer.precision", "16-mixed", "bf16-mixed or 32-true on a CPU (fp16 autocast needs a GPU)"
            )


def _check_checkpoint_callback(node: Any) -> None:
    """The ModelCheckpoint settings that Lightning would only reject once the data is loaded."""
    if node is None:
        return
    every = node.get("every_n_train_steps")
    if every is not None:
        _positive_int(every, "callbacks.checkpoint.every_n_train_steps", allow_zero=True)
    top_k = node.get("save_top_k", 1)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1:
        raise ConfigError("callbacks.checkpoint.save_top_k", top_k, "-1 (keep all), 0 (none) or a positive integer")
    _choice(node.get("mode", "min"), "callbacks.checkpoint.mode", ("min", "max"))


def _check_output_dir(output_dir: Optional[str]) -> None:
    """``paths.output_dir`` must be a directory this process can create or write into."""
    if output_dir is None:
        return
    path = Path(output_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError("paths.output_dir", output_dir, "a directory (this path is a file)")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError("paths.output_dir", output_dir, f"a writable location ({existing} is not writable)")


def check_arguments(node: Any, field: str, *supplied: str) -> Any:
    """The class or function ``node._target_`` names, once sure that a call with the node's values (plus
    the arguments named in ``supplied``) would bind: ConfigError for an unknown ``_target_``, a value left
    missing (``???``), an argument the target does not take, or a required one left out."""
    import inspect

    from hydra._internal.utils import _locate  # what instantiate resolves _target_ with (get_object also logs)

    target = node["_target_"]
    try:
        made = _locate(target)
    except Exception as err:
        raise ConfigError(
            f"{field}._target_", target, f"an importable class or function ({err.__cause__ or err})"
        ) from None
    keys = [k for k in node if not str(k).startswith("_")]
    missing = [k for k in keys if OmegaConf.is_config(node) and OmegaConf.is_missing(node, k)]
    try:
        params = inspect.signature(made).parameters
    except ValueError:  # no signature to check (some builtins): the call itself decides
        params = None
    if params is not None:
        takes = [n for n, p in params.items() if n not in supplied and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            for key in keys:
                if key not in params:
                    raise ConfigError(f"{field}.{key}", node[key], f"an argument of {target}: {', '.join(takes)}")
        if not node.get("_partial_", False):
            missing += [n for n in takes if params[n].default is params[n].empty and n not in keys]
    if missing:
        raise ConfigError(f"{field}.{missing[0]}", None, f"a value: {target} needs it (e.g. {field}.{missing[0]}=...)")
    return made


def instantiate_node(node: Any, field: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate(node, **kwargs)`` after ``check_arguments``, with a ConfigError (or
    Lightning's MisconfigurationException) of the constructor itself reported as one ConfigError."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    check_arguments(node, field, *kwargs)
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, ConfigError):
            raise cause from None
        if type(cause).__name__ == "MisconfigurationException":  # Lightning's own "this setting cannot work"
            raise ConfigError(field, node["_target_"], f"settings {node['_target_']} accepts ({cause})") from None
        raise
