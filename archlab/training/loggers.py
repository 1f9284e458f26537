"""Loggers: ``CSVLogger``, Lightning's CSV logger whose ``metrics.csv`` survives a resumed run; and the
experiment trackers ``MLFlowLogger`` and ``WandbLogger``, which also take the run's config and summary.

Lightning's CSV logger deletes an existing ``metrics.csv`` when a run starts, so a run resumed in its
directory lost every row logged before; and it writes rows only every 100 steps, so a killed run lost
those since. The trackers' libraries are imported only when one is chosen (the ``tracking`` extra).
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import IO, Any, Optional, cast

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger
from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_only

from archlab.config.train import sweep_job
from archlab.errors import ConfigError


class _ContinuingWriter(ExperimentWriter):
    """Keeps the rows of ``metrics.csv`` logged before step ``keep_before`` (None: starts the file over,
    as Lightning does) and appends after them."""

    def __init__(self, log_dir: str, keep_before: Optional[int]):
        self.keep_before = keep_before
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        path = self.metrics_file_path
        if self.keep_before is None or not self._fs.isfile(path):
            return super()._check_log_dir_exists()
        with self._fs.open(path, "r", newline="") as f:
            reader = csv.DictReader(cast(IO[str], f))  # fsspec opens a text mode file as a TextIOWrapper
            # a row's step is the optimizer steps done before it was logged: the rows of steps after the
            # checkpoint's (written before a kill) are logged again by the resumed run
            rows = [r for r in reader if r.get("step") and int(float(r["step"])) < self.keep_before]
            keys = list(reader.fieldnames or [])
        with self._fs.open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)
        self.metrics_keys = keys


class CSVLogger(LightningCSVLogger):
    """``metrics.csv`` under ``<save_dir>/<name>/<version>``; after ``continue_from(step)`` the rows logged
    before that checkpoint step are kept. Rows are written at every checkpoint too, so a killed run's
    log reaches at least its newest checkpoint."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._keep_before: Optional[int] = None

    def continue_from(self, step: int) -> None:
        """This run resumes from a checkpoint taken after ``step`` optimizer steps."""
        self._keep_before = step

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuingWriter(self.log_dir, self._keep_before)
        assert isinstance(self._experiment, ExperimentWriter)  # set by this property only
        return self._experiment

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self.save()


# ---------------------------------------------------------------- experiment trackers (logger=mlflow|wandb)


def _require(module: str) -> None:
    """One ConfigError naming the logger when its library is not installed."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"logger.{module}", module, "a logger whose library is installed: pip install 'archlab[tracking]'"
        )


def _override_tags(overrides: list[str]) -> dict[str, str]:
    """A tag per command-line override (``model/mlp=swiglu``: tag ``model/mlp``, value ``swiglu``), the
    ``+`` or ``~`` before a key left off; MLflow keeps tag values up to 5000 characters."""
    tags = {}
    for override in overrides:
        key, _, value = override.partition("=")
        key = key.lstrip("+~")
        if key:
            tags[key] = value[:5000]
    return tags


def summary_fields(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's scalars as flat ``summary/<key>`` entries (numbers and strings; nulls left out): status
    and error, steps, wall time, the final metrics (those evaluated during training too), the primary
    metric, the throughput and the evaluation's cost."""
    evaluation = summary.get("evaluation") or {}
    parts = {
        "status": summary.get("status"),
        "error": summary.get("error"),
        "steps": summary.get("steps"),
        "wall_time_s": summary.get("wall_time_s"),
        "final": {
            **{k: v for k, v in (summary.get("metrics") or {}).get("final", {}).items() if k != "step"},
            **(evaluation.get("final") or {}),
        },
        "primary_metric": summary.get("primary_metric"),
        "throughput": summary.get("throughput"),
        "evaluation": {k: evaluation.get(k) for k in ("seconds", "seconds_per_evaluation", "fraction_of_training")},
    }
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}/{key}", inner)
        elif isinstance(value, (int, float, str)) and not isinstance(value, bool):
            flat[prefix] = value

    walk("summary", parts)
    return flat


def _numbers(fields: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in fields.items() if isinstance(v, (int, float)) and math.isfinite(v)}


class MLFlowLogger(LightningMLFlowLogger):
    """Lightning's MLflow logger. ``tracking_uri`` null: ``MLFLOW_TRACKING_URI`` if set, else a file store
    under ``save_dir`` (kept in maintenance mode by MLflow 3, which this opts into): conf/logger/mlflow.yaml
    makes it ``<run>/mlruns``, or ``<sweep dir>/mlruns`` for every run of a ``-m`` sweep. A sweep's run
    is named by its overrides (``run_name`` null) and tagged with each, the sweep and its seed. Its params
    are the run's whole resolved config (``log_config``); ``log_summary`` adds the summary's scalars
    (numbers as metrics, words as tags) and summary.json as an artifact."""

    def __init__(
        self,
        *args: Any,
        tracking_uri: Optional[str] = None,
        save_dir: str = "./mlruns",
        run_name: Optional[str] = None,
        tags: Optional[dict[str, Any]] = None,
        **kwargs: Any,
    ):
        _require("mlflow")
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"file:{save_dir}"
        if tracking_uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        job = sweep_job()
        if job is not None:  # a sweep's run: named by its overrides, tagged with each and with the sweep
            run_name = run_name or job[2][:250] or None
            tags = {**_override_tags(job[3]), "sweep": job[1], **(tags or {})}
        super().__init__(*args, tracking_uri=tracking_uri, save_dir=save_dir, run_name=run_name, tags=tags, **kwargs)
        self._config_logged = False

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """Lightning's, which starts the run on first use; the experiment is made under a lock (a
        parallel sweep's jobs share one store, where two would each make one of the same name), and
        ``mlflow.set_tracking_uri``'s ``MLFLOW_TRACKING_URI`` is taken back out of the environment, where
        the next run in this process (a sweep's) would take this run's store for the one it was given."""
        if self._initialized or self._run_id is not None:
            return super().experiment
        if self._experiment_id is None:
            self._experiment_id = self._experiment_of(self._experiment_name)
        before = os.environ.get("MLFLOW_TRACKING_URI")
        try:
            return super().experiment
        finally:
            if before is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            else:
                os.environ["MLFLOW_TRACKING_URI"] = before

    def _experiment_of(self, name: str) -> str:
        """The id of the live experiment ``name``, made if there is none (under a file lock in a file store)."""
        from contextlib import nullcontext

        from filelock import FileLock

        client = self._mlflow_client
        lock: Any = nullcontext()
        if self._tracking_uri.startswith("file:") and self.save_dir:
            os.makedirs(self.save_dir, exist_ok=True)
            lock = FileLock(os.path.join(self.save_dir, ".experiment.lock"))
        with lock:
            found = client.get_experiment_by_name(name)
            if found is not None and found.lifecycle_stage != "deleted":
                return found.experiment_id
            return client.create_experiment(name=name, artifact_location=self._artifact_location)

    @rank_zero_only
    def log_config(self, config: dict[str, Any]) -> None:
        """The run's config as params (nested keys joined by ``/``); it holds the module's hyperparameters,
        which Lightning's own call then leaves alone (MLflow refuses a param logged twice)."""
        super().log_hyperparams(config)
        self._config_logged = True
        if config.get("seed") is not None:
            self.experiment.set_tag(self.run_id, "seed", str(config["seed"]))

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        if not self._config_logged:
            super().log_hyperparams(params)

    @rank_zero_only
    def log_summary(self, summary: dict[str, Any]) -> None:
        client, run = self.experiment, self.run_id
        fields = summary_fields(summary)
        for key, value in _numbers(fields).items():
            client.log_metric(run, key, value, step=int(summary.get("steps") or 0))
        for key, value in fields.items():
            if isinstance(value, str):
                client.set_tag(run, key, value[:5000])  # MLflow keeps tag values up to 5000 characters
        client.log_dict(run, summary, "summary.json")

    @property
    def log_dir(self) -> str:
        """The run's directory in a file store, else ``<tracking uri>#<run id>``."""
        experiment_id, run_id = self.experiment_id, self.run_id  # reading them starts the run (rank 0)
        if self.save_dir:
            if experiment_id is None or run_id is None:
                raise RuntimeError("the MLflow run has no id: only global rank 0 starts it")
            return os.path.join(self.save_dir, experiment_id, run_id)
        return f"{self._tracking_uri}#{run_id}"


def wandb_mode(mode: Optional[str]) -> str:
    """``mode`` as given, else ``WANDB_MODE``, else online where this user has a W&B API key (the
    ``WANDB_API_KEY`` variable, or the netrc entry ``wandb login`` writes) and offline where not."""
    if mode is None:
        mode = os.environ.get("WANDB_MODE") or ("online" if _wandb_key() else "offline")
    if mode not in WANDB_MODES:
        raise ConfigError(
            "logger.wandb.mode", mode, f"null (WANDB_MODE, else online with an API key) or one of {list(WANDB_MODES)}"
        )
    return mode


WANDB_MODES = ("online", "offline", "disabled")


def _wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc

    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbLogger(LightningWandbLogger):
    """Lightning's W&B logger, offline unless this user can log in (``wandb_mode``); in a ``-m`` sweep
    ``group`` null is the sweep directory and ``name`` null the run's overrides. Its config is the
    run's whole resolved config (``log_config``). ``log_summary`` sets the summary's scalars in the run's
    summary, saves summary.json with the run's files and finishes the run (so a next run in this process,
    a sweep's, starts its own)."""

    def __init__(
        self,
        *args: Any,
        mode: Optional[str] = None,
        name: Optional[str] = None,
        group: Optional[str] = None,
        **kwargs: Any,
    ):
        _require("wandb")
        job = sweep_job()
        if job is not None:  # a sweep's run: in the sweep's group, named by its overrides
            name, group = name or job[2] or None, group or job[1]
        super().__init__(*args, mode=wandb_mode(mode), name=name, group=group, **kwargs)

    @rank_zero_only
    def log_config(self, config: dict[str, Any]) -> None:
        super().log_hyperparams(config)

    @rank_zero_only
    def log_summary(self, summary: dict[str, Any]) -> None:
        run = self.experiment
        run.summary.update(summary_fields(summary))
        path = summary.get("paths", {}).get("summary")
        if path and os.path.isfile(path):
            run.save(path, base_path=os.path.dirname(path), policy="now")
        run.finish()

    @property
    def log_dir(self) -> str:
        """This run's directory (``<save_dir>/wandb/<offline-run|run>-<date>-<id>``)."""
        return os.path.dirname(self.experiment.dir)


@rank_zero_only
def log_config(loggers: list[Any], config: dict[str, Any]) -> None:
    """Give each tracker the run's resolved config before fit (rank 0)."""
    for logger in loggers:
        if hasattr(logger, "log_config"):
            logger.log_config(config)


@rank_zero_only
def log_summary(loggers: list[Any], output_dir: str | Path) -> None:
    """Give each tracker the run's summary.json, completed or failed, once it is written (rank 0)."""
    path = Path(output_dir) / "summary.json"
    trackers = [lg for lg in loggers if hasattr(lg, "log_summary")]
    if trackers and path.is_file():
        summary = json.loads(path.read_text())
        for logger in trackers:
            logger.log_summary(summary)
