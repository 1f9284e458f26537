"""``validate_train``: the values of an ``archlab-train`` config, checked before any data is read or
weight allocated (their types were checked by Hydra against ``archlab.config.train`` at compose time)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from archlab import checks
from archlab.config import to_model_config
from archlab.config.fields import plain_dict
from archlab.config.train import world_size
from archlab.errors import ConfigError, SweepConfigError
from archlab.matching import QUANTITIES
from archlab.nn.validation import validate
from archlab.training.optim import command_line_sets
from archlab.training.outputs import check_keep
from archlab.training.parametrization import check_param
from archlab.training.sweep import in_multirun

PRECISIONS = ("32", "32-true", "bf16-mixed", "bf16-true", "16-mixed", "auto")
ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "auto")
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_notebook", "fsdp", "deepspeed")


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

    if not in_multirun():
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
    checks.choice("trainer.precision", str(t.precision), PRECISIONS)
    checks.choice("trainer.accelerator", t.accelerator, ACCELERATORS)
    if isinstance(t.strategy, str):
        checks.choice("trainer.strategy", t.strategy, STRATEGIES)
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
    for name in ("num_nodes", "max_steps", "val_check_interval", "accumulate_grad_batches", "log_every_n_steps"):
        checks.integer(f"trainer.{name}", t[name])
    checks.integer("trainer.num_sanity_val_steps", t.num_sanity_val_steps, 0)
    if t.gradient_clip_val is not None:
        checks.positive("trainer.gradient_clip_val", t.gradient_clip_val, "a positive number, or null for no clipping")
    if t.check_val_every_n_epoch is not None:
        checks.integer("trainer.check_val_every_n_epoch", t.check_val_every_n_epoch)
    v = t.limit_val_batches
    if v is not None and not (isinstance(v, int) and v >= 1 or isinstance(v, float) and 0.0 < v <= 1.0):
        raise ConfigError(
            "trainer.limit_val_batches", v, "null (all), a number of batches >= 1, or a fraction in (0, 1]"
        )
    if t.max_time is not None and not re.fullmatch(r"\d+:\d+:\d+:\d+", str(t.max_time)):
        raise ConfigError("trainer.max_time", t.max_time, 'null or a duration "DD:HH:MM:SS", e.g. "00:12:00:00"')
    _check_hardware(t)

    _check_optim(cfg.optim, t)
    _check_scheduler(cfg)
    checks.choice("match.quantity", cfg.match.quantity, [*QUANTITIES, "training_flops"])

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
        checks.integer("threads", cfg.threads)
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or not 0 <= cfg.seed < 2**32:
        raise ConfigError("seed", cfg.seed, "an integer in [0, 2**32) (what numpy and torch accept as a seed)")
    _check_checkpoint_callback((cfg.callbacks or {}).get("checkpoint"))
    if cfg.paths.output_dir is not None:
        checks.writable_dir("paths.output_dir", cfg.paths.output_dir)
    model = validate(to_model_config(cfg.model))
    if model.linear.kind == "bitlinear" and model.linear.weights == "offline":  # an update leaves them not ternary
        why = "online to train (offline holds a packed checkpoint's ternary weights, which serve as they are)"
        raise ConfigError("model.linear.weights", "offline", why)
    check_param(plain_dict(cfg.param), model, cfg.optim.kind)
    if cfg.lr_from is not None and command_line_sets(cfg, "optim.lr"):
        raise ConfigError("lr_from", cfg.lr_from, "null when optim.lr is set on the command line (it sets optim.lr)")
    group = cfg.lr_from_group
    if group is not None and (cfg.lr_from is None or not isinstance(group, DictConfig)):
        value = plain_dict(group) if isinstance(group, DictConfig) else group
        raise ConfigError(
            "lr_from_group", value, "null, or with lr_from a mapping {axis: value} of one group of its runs"
        )
    return cfg


def _check_optim(o: Any, t: Any) -> None:
    """The optimizer's kind, the fields it reads (set) and those it does not (null), and their values."""
    from archlab.training.optim import KIND_FIELDS, NULLABLE, OPTIMIZERS

    checks.choice("optim.kind", o.kind, list(OPTIMIZERS))
    used = OPTIMIZERS[o.kind]
    for name in KIND_FIELDS:
        if name not in used and o[name] is not None:
            users = "|".join(k for k, fields in OPTIMIZERS.items() if name in fields)
            raise ConfigError(
                f"optim.{name}", o[name], f"null: optim.kind={o.kind} does not use it (optim={users} does)"
            )
        if name in used and name not in NULLABLE and o[name] is None:
            raise ConfigError(f"optim.{name}", None, f"a value: optim.kind={o.kind} needs it")
    checks.positive("optim.lr", o.lr)
    checks.non_negative("optim.weight_decay", o.weight_decay)
    if o.betas is not None and (len(o.betas) != 2 or not all(0.0 <= b < 1.0 for b in o.betas)):
        raise ConfigError("optim.betas", list(o.betas), "two numbers in [0, 1)")
    if o.eps is not None:
        checks.positive("optim.eps", o.eps, "a positive number (it keeps AdamW's update finite where a gradient is 0)")
    if o.momentum is not None and not 0.0 <= o.momentum < 1.0:
        raise ConfigError("optim.momentum", o.momentum, "a number in [0, 1)")
    if o.nesterov and o.momentum == 0.0:
        raise ConfigError("optim.nesterov", o.nesterov, "false where optim.momentum=0 (Nesterov's step needs momentum)")
    if o.ns_steps is not None:
        checks.integer("optim.ns_steps", o.ns_steps)
    if o.adjust_lr_fn is not None:
        checks.choice("optim.adjust_lr_fn", o.adjust_lr_fn, ["original", "match_rms_adamw"])
    if o.adamw_lr is not None:
        checks.positive("optim.adamw_lr", o.adamw_lr, "a positive number, or null for optim.lr")
    sharded = (
        t.strategy in ("fsdp", "deepspeed") if isinstance(t.strategy, str) else "ModelParallel" in t.strategy._target_
    )
    if o.kind == "muon" and sharded:
        raise ConfigError(
            "optim.kind",
            "muon",
            "adamw or sgd under a sharded trainer (fsdp): Muon orthogonalises whole matrices, each process holds a shard",
        )


def _check_scheduler(cfg: DictConfig) -> None:
    """The schedule's kind and the fields it reads; a warm-up the command line did not set is fitted to the
    run (``fit_warmup``), one that was set must end before the decay begins."""
    from archlab.training.optim import fit_warmup
    from archlab.training.schedules import SCHEDULES, warmup_limit

    s, t = cfg.scheduler, cfg.trainer
    checks.choice("scheduler.kind", s.kind, list(SCHEDULES))
    checks.integer("scheduler.warmup_steps", s.warmup_steps, 0)
    if s.kind == "constant":
        for name in ("min_lr_ratio", "decay_steps", "decay_fraction"):
            if s[name] is not None:
                raise ConfigError(f"scheduler.{name}", s[name], "null: scheduler.kind=constant does not decay")
    else:
        if s.min_lr_ratio is None or not 0.0 <= s.min_lr_ratio <= 1.0:
            raise ConfigError(
                "scheduler.min_lr_ratio", s.min_lr_ratio, "a number in [0, 1] (the floor as a fraction of optim.lr)"
            )
        if s.decay_steps is not None:
            checks.integer(
                "scheduler.decay_steps", s.decay_steps, 1, "a positive integer, or null for trainer.max_steps"
            )
    if s.kind == "wsd":
        if s.decay_fraction is None or not 0.0 < s.decay_fraction < 1.0:
            raise ConfigError("scheduler.decay_fraction", s.decay_fraction, "a number strictly between 0 and 1")
    elif s.decay_fraction is not None:
        raise ConfigError("scheduler.decay_fraction", s.decay_fraction, f"null: scheduler.kind={s.kind} (wsd uses it)")

    fit_warmup(cfg)  # a warm-up not set on the command line is shortened to fit the run
    limit, why = warmup_limit(s, t.max_steps)
    if s.warmup_steps <= limit:
        return
    decay = s.decay_steps if s.decay_steps is not None else t.max_steps
    if why is not None:
        raise ConfigError(
            "scheduler.warmup_steps", s.warmup_steps, f"at most {limit}: the warm-up must end before {why}"
        )
    if s.decay_steps is None:
        raise ConfigError(
            "scheduler.warmup_steps",
            s.warmup_steps,
            f"fewer than trainer.max_steps={t.max_steps} (the schedule runs until then)",
        )
    raise ConfigError("scheduler.decay_steps", decay, f"more than scheduler.warmup_steps={s.warmup_steps}")


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
        checks.integer("callbacks.checkpoint.every_n_train_steps", every, 0)
    top_k = node.get("save_top_k", 1)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1:
        raise ConfigError("callbacks.checkpoint.save_top_k", top_k, "-1 (keep all), 0 (none) or a positive integer")
    if node.get("_target_") == "archlab.training.checkpoints.RunCheckpoint":  # the default; not Lightning's own
        check_keep(node.get("keep", "best_and_last"), top_k)
        if "save_last" in node:
            raise ConfigError(
                "callbacks.checkpoint.save_last",
                node.save_last,
                "unset: last.ckpt is always written (resume=auto continues from it); "
                "callbacks.checkpoint.keep chooses which other checkpoints stay",
            )
    checks.choice("callbacks.checkpoint.mode", node.get("mode", "min"), ("min", "max"))
