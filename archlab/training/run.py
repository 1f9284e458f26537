"""``train(cfg)``: one run from a composed ``train`` config (the body of ``archlab-train``).

Order matters: the whole config is validated, then the datamodule is constructed (it names the
vocabulary size and the longest sequence), then the model config is completed and checked again,
and only then does Lightning allocate weights (in ``LitModel.configure_model``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Optional

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from omegaconf import DictConfig, OmegaConf

from archlab.accounting import count
from archlab.config import ModelConfig, model_config_dict, to_model_config
from archlab.config.fields import plain_dict
from archlab.errors import ConfigError, DirectoryHoldsRun
from archlab.nn.validation import validate
from archlab.precision import resolve_precision
from archlab.run_files import SUMMARY
from archlab.training.branch import branch_checkpoint, branch_record
from archlab.training.checkpoints import AtomicCheckpointIO, check_checkpoint, config_differences
from archlab.training.instantiate import instantiate_group, instantiate_node
from archlab.training.loggers import CSVLogger, log_config, log_summary
from archlab.training.module import LitModel
from archlab.training.outputs import check_fresh, completed_summary, newest_checkpoint, output_dir, settle_hydra_files
from archlab.training.parametrization import describe as describe_param
from archlab.training.parametrization import parametrize
from archlab.training.recorder import RunRecorder
from archlab.training.summary import metric_names, write_summary
from archlab.training.sweep import apply_match, check_objective, ignored_settings, variant_choices
from archlab.training.validation import validate_train

log = logging.getLogger("archlab.train")


def train(cfg: DictConfig, transferred: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Fit, evaluate, export and summarise one run; returns the summary (empty off global rank 0). An
    ``lr_from`` is resolved before, into ``optim.lr`` and the tuned multipliers, by archlab-train
    (``archlab.report.proxy.transfer_lr``), whose record of it (``transferred``) summary.json keeps."""
    start = time.time()
    _single_console()
    validate_train(cfg)
    precision = resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator, cfg.model.d_model)
    log.info("precision: %s (%s)", *precision)
    out, out_field = output_dir(cfg)
    cfg.paths.output_dir = str(out)  # the logger and checkpoint configs interpolate it
    check_fresh(cfg, out, out_field)
    ckpt_path = resolve_checkpoint(cfg, out)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)

    # callbacks and loggers are cheap objects: made first, a mistake in them costs no data loading
    callbacks, loggers = instantiate_group(cfg.callbacks, "callbacks"), instantiate_group(cfg.logger, "logger")
    dm = instantiate_node(cfg.data, "data", seed=cfg.seed)
    model_cfg, matched = _model_for_data(cfg, dm)
    resumed_step, finished = _resume_point(cfg, out, out_field, ckpt_path, model_cfg)
    if finished is not None:
        return _nothing_to_train(cfg, finished)
    if resumed_step is not None:  # the CSV log keeps the rows up to the checkpoint
        for logger in loggers:
            if isinstance(logger, CSVLogger):
                logger.continue_from(resumed_step)
    _check_metric_names(cfg, list(dm.val_names))
    settle_hydra_files(keep=True, out=out)  # this attempt writes the run's summary: its config files are the run's

    info = _run_info(cfg, dm, model_cfg, matched, ckpt_path, start, precision)
    info["transferred"] = transferred
    recorder = RunRecorder(out, info, tokenizer=getattr(dm, "tokenizer", None), primary_metric=_primary_metric(dm))
    log_config(loggers, info["config"])  # trackers (mlflow, wandb): the run's config, then its summary
    try:
        trainer = _fit(cfg, model_cfg, dm, callbacks, loggers, recorder, ckpt_path, precision[0])
    finally:
        log_summary(loggers, out)
    if not trainer.is_global_zero:
        return {}
    summary = json.loads((out / SUMMARY).read_text())
    report(summary)
    return summary


def resolve_checkpoint(cfg: DictConfig, out: Path) -> Optional[str]:
    """``ckpt_path`` as given, or with ``resume=auto`` the newest checkpoint of this run directory; with
    ``branch_from``, the stable run's checkpoint this branch starts from (``training/branch.py``)."""
    if cfg.get("branch_from") is not None:
        return branch_checkpoint(cfg, out)
    if cfg.ckpt_path is not None:  # recorded in summary.json: absolute, like every path there, and as given
        return os.path.abspath(cfg.ckpt_path)  # (a last.ckpt link not swapped for its target of the moment)
    if cfg.resume == "auto":
        found = newest_checkpoint(out / "checkpoints")
        log.info("resume=auto: %s", f"continuing from {found}" if found else "no checkpoint yet, starting fresh")
        return str(found) if found else None
    return None


def _single_console() -> None:
    """The ``lightning`` package adds its own console handler; where the root logger already has
    handlers (Hydra's), drop it so each Lightning message is printed once."""
    if logging.getLogger().hasHandlers():
        lightning_log = logging.getLogger("lightning")
        for handler in list(lightning_log.handlers):
            lightning_log.removeHandler(handler)


def _model_for_data(cfg: DictConfig, dm: Any) -> tuple[ModelConfig, Optional[dict[str, Any]]]:
    """The model config completed by the data (vocab_size, context_length) and by ``match`` (the sized
    field), written back into ``cfg.model`` and checked again; with the match record."""
    cfg.model.vocab_size, cfg.model.context_length = int(dm.vocab_size), int(dm.max_seq_len)
    matched = apply_match(cfg)  # match.reference: size match.field to the reference's parameter count
    model_cfg = validate(to_model_config(cfg.model))
    if model_cfg.head.vocab not in (None, model_cfg.vocab_size):  # a target past the head's rows has no logit
        allowed = f"null or {model_cfg.vocab_size} to train: the data's ids reach {model_cfg.vocab_size - 1}"
        raise ConfigError("model.head.vocab", model_cfg.head.vocab, allowed)
    log.info(
        "model.vocab_size=%d and model.context_length=%d come from the data (%s)",
        model_cfg.vocab_size,
        model_cfg.context_length,
        type(dm).__name__,
    )
    for line in ignored_settings(cfg, model_cfg):
        log.warning(line)
    if (line := describe_param(cfg.param, model_cfg)) is not None:
        log.info(line)
    return parametrize(model_cfg, cfg.param), matched


def _resume_point(
    cfg: DictConfig, out: Path, out_field: str, ckpt_path: Optional[str], model_cfg: ModelConfig
) -> tuple[Optional[int], Optional[dict[str, Any]]]:
    """The step the checkpoint resumes from (None: a fresh start), once sure it fits this run; and, with
    ``resume=auto`` on a run already trained to ``trainer.max_steps`` and summarised, that run's summary.

    A completed run is left as it is; one killed before writing its export and summary gets them from its
    last checkpoint (fit restores it, with no step left)."""
    auto = cfg.ckpt_path is None and cfg.resume == "auto"
    model = model_config_dict(model_cfg)
    field = "ckpt_path" if cfg.ckpt_path else "resume"
    resumed_step = check_checkpoint(ckpt_path, model, field, cfg.trainer.max_steps, allow_done=auto)
    done = completed_summary(out) if auto else None
    if done is not None and resumed_step is None:  # checkpoints were off (callbacks.checkpoint=null)
        diffs = config_differences(done.get("model") or {}, model)
        if done.get("steps") != cfg.trainer.max_steps or diffs:
            raise DirectoryHoldsRun(
                out_field,
                str(out),
                "a directory without an earlier run, or one to continue; "
                f"this one holds a completed run of {done.get('steps')} steps and no checkpoint "
                "to continue from (callbacks.checkpoint was null, or they were deleted)"
                + (f", and its model differs in {'; '.join(diffs)}" if diffs else "")
                + ". Give a new directory",
            )
    finished = done is not None and done.get("steps") == cfg.trainer.max_steps
    return resumed_step, done if finished else None


def _nothing_to_train(cfg: DictConfig, done: dict[str, Any]) -> dict[str, Any]:
    """Report a run that already completed its steps, leaving its directory (and its ``.hydra``) as it was."""
    settle_hydra_files(keep=False)
    print(
        f"nothing to train: this run already completed its trainer.max_steps={cfg.trainer.max_steps} steps "
        "(raise trainer.max_steps to train on)",
        flush=True,
    )
    report(done)
    return done


def _check_metric_names(cfg: DictConfig, val_names: list[str]) -> None:
    """A checkpoint ``monitor`` and the sweep ``objective`` must each name a metric this data produces."""
    node = (cfg.callbacks or {}).get("checkpoint")
    monitor = node.get("monitor") if node is not None else None
    allowed = metric_names(val_names)
    if monitor is not None and monitor not in allowed:
        raise ConfigError("callbacks.checkpoint.monitor", monitor, "null or one of " + ", ".join(allowed))
    check_objective(cfg.objective, val_names)


def _primary_metric(dm: Any) -> str:
    """The metric the run reports last: accuracy where the data has a chance level, else the loss."""
    name = dm.val_names[0]
    return f"{name}/acc" if getattr(dm, "chance_accuracy", None) is not None else f"{name}/loss"


def _run_info(
    cfg: DictConfig,
    dm: Any,
    model_cfg: ModelConfig,
    matched: Optional[dict[str, Any]],
    ckpt_path: Optional[str],
    start: float,
    precision: tuple[str, str],
) -> dict[str, Any]:
    """What summary.json records of the run before fit: its variant, model, data, sizing and config."""
    return {
        "start_time": start,
        "seed": cfg.seed,
        "choices": variant_choices(cfg),
        "model": model_config_dict(model_cfg),
        "model_from_data": {"vocab_size": model_cfg.vocab_size, "context_length": model_cfg.context_length},
        "data": {
            "class": type(dm).__name__,
            "val_names": list(dm.val_names),
            "chance_accuracy": getattr(dm, "chance_accuracy", None),
            "documents": getattr(dm, "documents", None),
        },
        "flops_per_token": count(model_cfg)["flops_per_token"],
        "match": matched,
        "ignored": ignored_settings(cfg, model_cfg),
        "resumed_from": ckpt_path,
        "branch": branch_record(cfg),
        "precision": {"setting": str(cfg.trainer.precision), "used": precision[0], "why": precision[1]},
        "config": {
            k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
            for k, v in cfg.items()
            if k != "hydra"
        },
    }


def _fit(
    cfg: DictConfig,
    model_cfg: ModelConfig,
    dm: Any,
    callbacks: list[Any],
    loggers: list[Any],
    recorder: RunRecorder,
    ckpt_path: Optional[str],
    precision: str,
) -> L.Trainer:
    """Build the LightningModule and the Trainer and fit. ``recorder`` writes the summary; a failure it
    did not record (the module or the trainer failing to build) gets a failed summary here."""
    callbacks = [*callbacks, *getattr(dm, "callbacks", []), recorder]  # a datamodule's own: a mixture's counts
    trainer = lit = None
    try:
        lit = LitModel(
            model=model_config_dict(model_cfg),
            optim=plain_dict(cfg.optim, resolve=True),
            scheduler=plain_dict(cfg.scheduler, resolve=True),
            param=plain_dict(cfg.param, resolve=True),
            val_names=list(dm.val_names),
            compile=cfg.compile,
            activation_checkpointing=cfg.activation_checkpointing,
            documents=getattr(dm, "documents", None),
            val_pools=getattr(dm, "val_pools", None),
        )
        trainer = instantiate_node(
            cfg.trainer,
            "trainer",
            precision=precision,  # trainer.precision=auto resolved for this machine
            callbacks=callbacks,
            logger=loggers or False,
            enable_progress_bar=any(isinstance(c, ProgressBar) for c in callbacks),
            # callbacks.checkpoint=null means no checkpoints, not Lightning's default one
            enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
            max_epochs=-1,
            default_root_dir=str(recorder.output_dir),
            plugins=[AtomicCheckpointIO()],  # a kill while saving leaves the previous checkpoint whole
        )
        trainer.fit(lit, datamodule=dm, ckpt_path=ckpt_path)
    except BaseException as err:
        if not recorder.wrote and (trainer is None or trainer.is_global_zero):
            write_summary(recorder.output_dir, recorder.summary(trainer, lit, "failed", err))
        raise
    return trainer


def report(summary: dict[str, Any]) -> None:
    """Print where the run's files are and its final metric against chance."""
    p = summary["paths"]
    metric = summary.get("primary_metric") or {}
    value, chance = metric.get("value"), metric.get("chance")
    lines = [
        f"final {metric.get('name')}: "
        + ("n/a" if value is None else f"{value:.4f}")
        + ("" if chance is None else f"  (chance {chance:.4f})"),
        f"summary:    {p['summary']}",
        f"checkpoint: {p['checkpoint']}",
        f"export:     {p['export']}",
        f"logs:       {', '.join(p['logs']) or 'none (logger=none)'}",
    ]
    print("\n".join(lines), flush=True)
