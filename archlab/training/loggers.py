"""``CSVLogger``: Lightning's CSV logger, whose ``metrics.csv`` survives a resumed run.

Lightning's deletes an existing ``metrics.csv`` when a run starts, so a run resumed in its directory
lost every row logged before; and it writes rows only every 100 steps, so a killed run lost those since.
"""

from __future__ import annotations

import csv
from typing import Any, Optional

from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only


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
            reader = csv.DictReader(f)
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
        return self._experiment

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self.save()
