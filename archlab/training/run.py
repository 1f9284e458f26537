"""``train(cfg)``: one run from a composed ``train`` config (the body of ``archlab-train``).

Order matters: the whole config is validated, then the datamodule is constructed (it names the
vocabulary size and the longest sequence), then the model config is completed and checked again,
and only then does Lightning allocate weights (in ``LitModel.configure_model``).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Optional

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from omegaconf import DictConfig, OmegaConf

from archlab.accounting import count
from archlab.build import CONF_DIR
from archlab.config import model_config_dict, to_model_config
from archlab.errors import ConfigError, DirectoryHoldsRun
from archlab.nn.validation import validate
from archlab.training.checkpoints import AtomicCheckpointIO, check_checkpoint, config_differences
from archlab.training.config import instantiate_node, validate_train
from archlab.training.loggers import CSVLogger
from archlab.training.module import LitModel
from archlab.training.outputs import check_fresh, completed_summary, newest_checkpoint, output_dir, settle_hydra_files
from archlab.training.recorder import RunRecorder
from archlab.training.summary import SUMMARY, write_summary
from archlab.training.sweep import apply_match, check_objective

log = logging.getLogger("archlab.train")


def resolve_checkpoint(cfg: DictConfig, out: Path) -> Optional[str]:
    """``ckpt_path`` as given, or with ``resume=auto`` the newest checkpoint of this run directory."""
    if cfg.ckpt_path is not None:
        return str(Path(cfg.ckpt_path).resolve())  # recorded in summary.json: absolute, like every path there
    if cfg.resume == "auto":
        found = newest_checkpoint(out / "checkpoints")
        log.info("resume=auto: %s", f"continuing from {found}" if found else "no checkpoint yet, starting fresh")
        return str(found) if found else None
    return None


def variant_choices(cfg: DictConfig) -> dict[str, Any]:
    """The config-group choices of this run (``model``, ``model/position``, ``data``, ...), Hydra's own left out."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        choices = OmegaConf.to_container(HydraConfig.get().runtime.choices)
    else:  # composed with return_hydra_config=True, or none known
        known = OmegaConf.select(cfg, "hydra.runtime.choices", default=None)
        choices = OmegaConf.to_container(known) if known is not None else {}
    tuned = choices.pop("tuned@_global_", None)  # optional: only counts when tuned/<data>_<model>.yaml exists
    choices["tuned"] = tuned if tuned and (CONF_DIR / "tuned" / f"{tuned}.yaml").exists() else None
    return {k: v for k, v in choices.items() if not k.startswith("hydra")}


def _instantiate_all(nodes: Optional[DictConfig], group: str) -> list[Any]:
    return [instantiate_node(node, f"{group}.{name}") for name, node in (nodes or {}).items() if node is not None]


def _single_console() -> None:
    """The ``lightning`` package adds its own console handler; where the root logger already has
    handlers (Hydra's), drop it so each Lightning message is printed once."""
    if logging.getLogger().hasHandlers():
        lightning_log = logging.getLogger("lightning")
        for handler in list(lightning_log.handlers):
            lightning_log.removeHandler(handler)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Fit, evaluate, export and summarise one run; returns the summary (empty off global rank 0)."""
    start = time.time()
    _single_console()
    validate_train(cfg)
    out, out_field = output_dir(cfg)
    cfg.paths.output_dir = str(out)  # the logger and checkpoint configs interpolate it
    check_fresh(cfg, out, out_field)
    ckpt_path = resolve_checkpoint(cfg, out)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)

    # callbacks and loggers are cheap objects: made first, a mistake in them costs no data loading
    callbacks, loggers = _instantiate_all(cfg.callbacks, "callbacks"), _instantiate_all(cfg.logger, "logger")
    dm = instantiate_node(cfg.data, "data", seed=cfg.seed)
    cfg.model.vocab_size, cfg.model.context_length = int(dm.vocab_size), int(dm.max_seq_len)
    matched = apply_match(cfg)  # match.reference: size match.field to the reference's parameter count
    model_cfg = validate(to_model_config(cfg.model))
    auto = cfg.ckpt_path is None and cfg.resume == "auto"
    resumed_step = check_checkpoint(
        ckpt_path,
        model_config_dict(model_cfg),
        "ckpt_path" if cfg.ckpt_path else "resume",
        cfg.trainer.max_steps,
        allow_done=auto,
    )
    # resume=auto on a run trained to the end: a completed run is left as it is; one killed before writing
    # its export and summary gets them from its last checkpoint (fit restores it, with no step left)
    done = completed_summary(out) if auto else None
    if done is not None and resumed_step is None:  # checkpoints were off (callbacks.checkpoint=null)
        diffs = config_differences(done.get("model") or {}, model_config_dict(model_cfg))
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
    if done is not None and done.get("steps") == cfg.trainer.max_steps:
        settle_hydra_files(keep=False)
        print(
            f"nothing to train: this run already completed its trainer.max_steps={cfg.trainer.max_steps} steps "
            "(raise trainer.max_steps to train on)",
            flush=True,
        )
        report(done)
        return done
    if resumed_step is not None:  # the CSV log keeps the rows up to the checkpoint
        for logger in loggers:
            if isinstance(logger, CSVLogger):
                logger.continue_from(resumed_step)
    log.info(
        "model.vocab_size=%d and model.context_length=%d come from the data (%s)",
        model_cfg.vocab_size,
        model_cfg.context_length,
        type(dm).__name__,
    )
    val_names = list(dm.val_names)
    chance = getattr(dm, "chance_accuracy", None)
    primary = f"{val_names[0]}/acc" if chance is not None else f"{val_names[0]}/loss"
    _check_monitor(cfg, val_names)
    check_objective(cfg.objective, val_names)
    settle_hydra_files(keep=True, out=out)  # this attempt writes the run's summary: its config files are the run's

    counts = count(model_cfg)
    info = {
        "start_time": start,
        "seed": cfg.seed,
        "choices": variant_choices(cfg),
        "model": model_config_dict(model_cfg),
        "model_from_data": {"vocab_size": model_cfg.vocab_size, "context_length": model_cfg.context_length},
        "data": {"class": type(dm).__name__, "val_names": val_names, "chance_accuracy": chance},
        "flops_per_token": counts["flops_per_token"],
        "match": matched,
        "resumed_from": ckpt_path,
        "config": {
            k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
            for k, v in cfg.items()
            if k != "hydra"
        },
    }
    recorder = RunRecorder(out, info, tokenizer=getattr(dm, "tokenizer", None), primary_metric=primary)
    trainer = lit = None
    try:
        lit = LitModel(
            model=model_config_dict(model_cfg),
            optim=OmegaConf.to_container(cfg.optim, resolve=True),
            scheduler=OmegaConf.to_container(cfg.scheduler, resolve=True),
            val_names=val_names,
            compile=cfg.compile,
            activation_checkpointing=cfg.activation_checkpointing,
        )
        callbacks.append(recorder)
        trainer = instantiate_node(
            cfg.trainer,
            "trainer",
            callbacks=callbacks,
            logger=loggers or False,
            enable_progress_bar=any(isinstance(c, ProgressBar) for c in callbacks),
            # callbacks.checkpoint=null means no checkpoints, not Lightning's default one
            enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
            max_epochs=-1,
            default_root_dir=str(out),
            plugins=[AtomicCheckpointIO()],  # a kill while saving leaves the previous checkpoint whole
        )
        trainer.fit(lit, datamodule=dm, ckpt_path=ckpt_path)
    except BaseException as err:
        if not recorder.wrote and (trainer is None or trainer.is_global_zero):
            write_summary(out, recorder.summary(trainer, lit, "failed", err))
        raise
    if not trainer.is_global_zero:
        return {}
    summary = json.loads((out / SUMMARY).read_text())
    report(summary)
    return summary


def _check_monitor(cfg: DictConfig, val_names: list[str]) -> None:
    """A checkpoint ``monitor`` must name a metric this data produces."""
    node = (cfg.callbacks or {}).get("checkpoint")
    monitor = node.get("monitor") if node is not None else None
    allowed = [f"{n}/{m}" for n in val_names for m in ("loss", "ppl", "acc")]
    if monitor is not None and monitor not in allowed:
        raise ConfigError("callbacks.checkpoint.monitor", monitor, "null or one of " + ", ".join(allowed))


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
