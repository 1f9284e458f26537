"""Evaluation during training (``callbacks.evaluation``): every N optimizer steps and at the end, held-out
perplexity on named validation sets and lm-evaluation-harness tasks, through ``archlab-eval``'s own code
(``perplexity.py``, ``harness.py``), logged to every tracker and recorded in summary.json with its cost.

Training instantiates it from its config node's ``_target_``, as every callback, and never imports it:
evaluation sits above training in docs/architecture.md. Global rank 0 evaluates the whole model while the
other ranks wait at a barrier; a strategy that shards the weights (FSDP) is refused."""

from __future__ import annotations

import importlib.util
import logging
import random
import re
import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from archlab import checks
from archlab.data.tokens import read_meta
from archlab.errors import ConfigError
from archlab.evaluation.perplexity import VAL, HeldOut, check_settings, perplexity, read_held_out
from archlab.nn.model import Decoder
from archlab.training.module import LitModel

log = logging.getLogger("archlab.train")

FIELD = "callbacks.evaluation"
PREFIX = "eval"  # every metric it logs is eval/<set or task>/<metric>
NAME = re.compile(r"[A-Za-z0-9_.-]+")  # a set's name: one path part of its metrics' names


@contextmanager
def field_prefix() -> Iterator[None]:
    """Re-raise archlab-eval's ConfigErrors (``seq_len``, ``tasks`` ...) under ``callbacks.evaluation.``."""
    try:
        yield
    except ConfigError as err:
        raise ConfigError(f"{FIELD}.{err.field}", err.value, err.allowed) from None


@contextmanager
def kept_rng() -> Iterator[None]:
    """Python's, numpy's and torch's random states as they were: lm-eval seeds all three, and training's
    dropout and sampling must draw as they would without evaluation."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def task_metric(task: str, key: str) -> str:
    """lm-eval's ``<metric>,<filter>`` of ``task`` as a tracker's name: ``eval/<task>/<metric>``, the filter
    after a dot where it is not ``none`` (``eval/gsm8k/exact_match.strict-match``)."""
    metric, _, kind = key.partition(",")
    return f"{PREFIX}/{task}/{metric}" + ("" if kind in ("", "none") else f".{kind}")


class TrainingEvaluation(Callback):
    """Held-out perplexity of each of ``perplexity`` (name -> a UTF-8 text file or a shard directory, its
    val.bin) and lm-eval's ``tasks`` (local ones in ``include_path``) every ``every_n_steps`` optimizer steps
    and after the last, with archlab-eval's settings of the same names. ``every_n_steps`` null: off."""

    def __init__(
        self,
        every_n_steps: Optional[int] = None,
        perplexity: Optional[Mapping[str, str]] = None,
        tasks: Optional[list[str]] = None,
        include_path: Optional[str] = None,
        num_fewshot: Optional[int] = None,
        limit: Optional[float] = None,
        prefix_token_id: Optional[int] = None,
        batch_size: int = 8,
        seq_len: Optional[int] = None,
        stride: Optional[int] = None,
        document_mask: bool = False,
        reset_positions: bool = False,
    ):
        self.sets = {str(k): str(v) for k, v in (perplexity or {}).items()}
        self.tasks = [str(t) for t in tasks] if tasks is not None else []
        self.every_n_steps = every_n_steps
        self.include_path, self.num_fewshot, self.limit = include_path, num_fewshot, limit
        self.prefix_token_id, self.batch_size = prefix_token_id, batch_size
        self.seq_len, self.stride = seq_len, stride
        self.document_mask, self.reset_positions = document_mask, reset_positions
        self.history: list[dict[str, float]] = []
        self.seconds = 0.0  # spent evaluating, this attempt and those before a resume
        self.earlier_elapsed = 0.0  # training time of the attempts before a resume
        self._started: Optional[float] = None
        self._held_out: dict[str, HeldOut] = {}
        self._window = self._stride = 0
        self._manager: Any = None
        self._eos: Optional[int] = None
        self._tokenizer: Any = None
        self._check()

    @property
    def enabled(self) -> bool:
        return self.every_n_steps is not None

    def _check(self) -> None:
        """Every setting that needs no data: refused naming ``callbacks.evaluation.<field>``."""
        if self.every_n_steps is None:
            if self.sets or self.tasks:
                raise ConfigError(
                    f"{FIELD}.every_n_steps", None, "an integer >= 1 where perplexity or tasks are set (null: off)"
                )
            return
        checks.integer(f"{FIELD}.every_n_steps", self.every_n_steps, 1, "null (off) or an integer >= 1")
        if not self.sets and not self.tasks:
            raise ConfigError(
                f"{FIELD}.perplexity",
                {},
                "at least one held-out set (name: text file or shard directory), or tasks, with every_n_steps",
            )
        for name, path in self.sets.items():
            if not NAME.fullmatch(name) or name in self.tasks:
                raise ConfigError(
                    f"{FIELD}.perplexity",
                    name,
                    "names of letters, digits and _.- (each is a metric's eval/<name>/...), none a task's",
                )
            source = Path(path).expanduser()
            if not source.is_file() and not (source / VAL).is_file():
                raise ConfigError(
                    f"{FIELD}.perplexity.{name}",
                    path,
                    f"a UTF-8 text file or a shard directory holding {VAL} and meta.json (archlab-prepare's)"
                    + ("; nothing is at this path" if not source.exists() else ""),
                )
        checks.integer(f"{FIELD}.batch_size", self.batch_size, 1, "an integer >= 1")
        for name in ("document_mask", "reset_positions"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{FIELD}.{name}", getattr(self, name), "true or false")
        if self.num_fewshot is not None:
            checks.integer(f"{FIELD}.num_fewshot", self.num_fewshot, 0, "null or an integer >= 0")
        limit = self.limit
        if limit is not None and not (
            not isinstance(limit, bool) and limit > 0 and (limit < 1 or float(limit).is_integer())
        ):
            raise ConfigError(
                f"{FIELD}.limit", limit, "null, an integer >= 1 (examples per task) or a fraction in (0, 1)"
            )
        if self.prefix_token_id is not None:
            checks.integer(f"{FIELD}.prefix_token_id", self.prefix_token_id, 0, "null or a token id >= 0")
        if self.tasks:
            if importlib.util.find_spec("lm_eval") is None:
                raise ConfigError(
                    f"{FIELD}.tasks", self.tasks, 'tasks with lm-eval installed: pip install -e ".[eval]"'
                )
            from archlab.evaluation.harness import task_manager

            with field_prefix():
                self._manager = task_manager(self.tasks, self.include_path)
        elif self.include_path is not None:
            raise ConfigError(f"{FIELD}.include_path", self.include_path, "null: no tasks are set")

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Read the sets with the run's tokenizer and check them against the model, on every rank (so every
        rank refuses alike), before any step."""
        if not self.enabled or stage != "fit":
            return
        strategy = type(trainer.strategy).__name__
        if "FSDP" in strategy or "ModelParallel" in strategy:
            raise ConfigError(
                FIELD,
                strategy,
                "a strategy holding the whole weights on global rank 0 (one device, ddp): this one shards them",
            )
        if not isinstance(pl_module, LitModel):
            raise TypeError(f"TrainingEvaluation needs archlab's LitModel, not {type(pl_module).__name__}")
        dm = trainer.datamodule  # pyright: ignore[reportAttributeAccessIssue]
        self._tokenizer = getattr(dm, "tokenizer", None)
        if self._tokenizer is None:
            raise ConfigError(
                FIELD,
                type(dm).__name__,
                "data with a tokenizer (data=text, or shards archlab-prepare wrote): held-out text and tasks are text",
            )
        cfg = pl_module.model_cfg
        for name, path in self.sets.items():
            self._held_out[name] = read_held_out(path, self._tokenizer, cfg.vocab_size, f"{FIELD}.perplexity.{name}")
            with field_prefix():
                self._window, self._stride = check_settings(
                    self._held_out[name],
                    cfg.context_length,
                    self.seq_len,
                    self.stride,
                    self.document_mask,
                    self.reset_positions,
                )
        self._eos = data_eos(dm)
        if self.prefix_token_id is not None and self.prefix_token_id >= cfg.vocab_size:
            raise ConfigError(f"{FIELD}.prefix_token_id", self.prefix_token_id, f"null or an id below {cfg.vocab_size}")
        if self.tasks and self._eos is None and self.prefix_token_id is None:
            from archlab.evaluation.harness import rolling_tasks

            rolling = rolling_tasks(self._manager, self.tasks)
            if rolling:
                raise ConfigError(
                    f"{FIELD}.prefix_token_id",
                    None,
                    f"a token id: {', '.join(rolling)} score texts from their start, conditioned on it, and this "
                    "run's data has no EOS to take",
                )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        every, step = self.every_n_steps, trainer.global_step
        if every is not None and step > 0 and step % every == 0 and step != self.last_step:
            self._evaluate(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.enabled and trainer.global_step != self.last_step:  # the final weights, the ones exported
            self._evaluate(trainer, pl_module)

    @property
    def last_step(self) -> Optional[int]:
        return int(self.history[-1]["step"]) if self.history else None

    def elapsed(self) -> float:
        """Seconds of training so far (evaluation included), over every attempt of the run."""
        now = time.perf_counter()
        return self.earlier_elapsed + (now - self._started if self._started is not None else 0.0)

    def _evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Rank 0 measures, logs to every logger and prints the cost; the other ranks wait for it."""
        step = trainer.global_step
        if trainer.is_global_zero:
            start = time.perf_counter()
            metrics = self.measure(pl_module)
            seconds = time.perf_counter() - start
            self.seconds += seconds
            self.history.append({"step": step, **metrics, "seconds": seconds})
            for logger in trainer.loggers:  # at the step Lightning logs train/ and val/ with at this point
                logger.log_metrics(metrics, step=max(step - 1, 0))
            shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
            log.info(
                "evaluation at step %d: %s (%.2f s; evaluation %.1f%% of the training time so far)",
                step,
                shown,
                seconds,
                100 * self.seconds / max(self.elapsed(), 1e-9),
            )
        trainer.strategy.barrier("archlab_evaluation")

    def measure(self, pl_module: L.LightningModule) -> dict[str, float]:
        """The figures of every set and task on the module's weights as they are (their own dtype, no
        autocast, as archlab-eval reads the export), its training mode and every RNG left as they were."""
        assert isinstance(pl_module, LitModel)
        model = pl_module.decoder
        training = model.training
        device = str(pl_module.device)
        out: dict[str, float] = {}
        try:
            with kept_rng():
                for name, held_out in self._held_out.items():
                    found = perplexity(
                        model,
                        held_out,
                        self._window,
                        self._stride,
                        self.batch_size,
                        device,
                        self.document_mask,
                        self.reset_positions,
                    )
                    out[f"{PREFIX}/{name}/ppl"], out[f"{PREFIX}/{name}/nll"] = found["ppl"], found["nll"]
                if self.tasks:
                    out.update(self._tasks(model, device))
        finally:
            model.train(training)
        return out

    def _tasks(self, model: Decoder, device: str) -> dict[str, float]:
        from archlab.evaluation.harness import ArchlabLM, evaluate

        lm = ArchlabLM(model, self._tokenizer, self.batch_size, device, self._eos, self.prefix_token_id)
        results = evaluate(lm, self.tasks, self._manager, self.num_fewshot, self.limit)["results"]
        return {
            task_metric(task, key): float(value)
            for task, metrics in results.items()
            for key, value in metrics.items()
            if "," in key and "_stderr" not in key and isinstance(value, (int, float)) and not isinstance(value, bool)
        }

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history), "seconds": self.seconds, "elapsed": self.elapsed()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
        self.seconds = float(state_dict.get("seconds", 0.0))
        self.earlier_elapsed = float(state_dict.get("elapsed", 0.0))

    def summary_fields(self) -> dict[str, Any]:
        """summary.json's ``evaluation``: the settings, every evaluation (step, figures, seconds), the last
        one's figures and the cost; nothing where it is off."""
        if not self.enabled:
            return {}
        final = {k: v for k, v in (self.history[-1] if self.history else {}).items() if k.startswith(PREFIX)}
        times = [h["seconds"] for h in self.history]
        return {
            "evaluation": {
                "every_n_steps": self.every_n_steps,
                "perplexity": self.sets,
                "tasks": self.tasks,
                "on": "global rank 0",
                "history": self.history,
                "final": final,
                "seconds": self.seconds,
                "seconds_per_evaluation": statistics.fmean(times) if times else None,
                "fraction_of_training": self.seconds / self.elapsed() if self._started is not None else None,
            }
        }


def data_eos(dm: Any) -> Optional[int]:
    """The EOS id the run's data separates documents with, as archlab-eval finds a run's: the data's
    ``eos_id`` (``data.documents``), else its shards' meta.json; None where neither names one."""
    documents = getattr(dm, "documents", None) or {}
    if isinstance(documents.get("eos_id"), int):
        return documents["eos_id"]
    directory = getattr(dm, "dir", None)
    meta = read_meta(Path(directory)) if directory is not None else None
    eos = (meta or {}).get("eos_id")
    return eos if isinstance(eos, int) else None
