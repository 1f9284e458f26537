"""What a ``-m`` sweep prints: every line of a job carries its number (parallel jobs interleave), a message
from another package that every job repeats (Lightning's hardware lines and tips, deprecation warnings) is
printed the first time only, and the sweep ends with one line: how many jobs completed and failed, and the
report command. ``SweepConsole`` is the Hydra callback that does it (``hydra.callbacks`` in conf/train.yaml);
``archlab-train`` calls ``end_sweep`` once Hydra returns."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any, Optional, TextIO

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

RECORDS = ".archlab-sweep"  # in the sweep directory: each job's outcome, and the messages already shown
ARCHLAB_DIR = str(Path(__file__).resolve().parents[1]) + os.sep  # a warning raised in here is a job's own

_sweep: Optional[Path] = None  # the sweep this process launched (set in the launching process only)
_job: Optional[JobConsole] = None  # the job this process runs now


class SweepConsole(Callback):
    """Hydra's hooks around a sweep and each of its jobs (jobs of a plain run are left as they are)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _sweep
        sweep = Path(str(config.hydra.sweep.dir))
        shutil.rmtree(sweep / RECORDS, ignore_errors=True)  # a re-run of the sweep counts its own jobs
        (sweep / RECORDS / "jobs").mkdir(parents=True)
        _sweep = sweep

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _job
        records = _records(config)
        if records is None:
            return
        _job_file(records, config).write_text("started")  # a job that never ends (killed) counts as failed
        if "submitit" not in str(config.hydra.launcher.get("_target_", "")):  # SLURM: a log file per job
            _job = JobConsole(f"[job {config.hydra.job.num}] ", Shown(records / "shown"))
            _job.install()

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        records = _records(config)
        if records is None:
            return
        _end_job()
        _job_file(records, config).write_text("completed" if job_return.status == JobStatus.COMPLETED else "failed")


def _records(config: DictConfig) -> Optional[Path]:
    """The sweep's records directory, None for a plain run (its ``hydra.sweep.dir`` is relative to the
    directory the command started in)."""
    from hydra.types import RunMode

    if config.hydra.mode != RunMode.MULTIRUN:
        return None
    return Path(config.hydra.runtime.cwd) / str(config.hydra.sweep.dir) / RECORDS


def _job_file(records: Path, config: DictConfig) -> Path:
    return records / "jobs" / str(config.hydra.job.num)


def _end_job() -> None:
    global _job
    if _job is not None:
        _job.uninstall()
        _job = None


def end_sweep() -> None:
    """Print the sweep's last line, ``<completed>/<jobs> completed, <failed> failed — archlab-report <dir>``,
    once the sweep this process launched has ended, however it ended; nothing after a plain run."""
    global _sweep
    if _sweep is None:
        return
    _end_job()  # a job that stopped the whole sweep (sys.exit) never reached on_job_end
    outcomes = [p.read_text() for p in (_sweep / RECORDS / "jobs").iterdir()]
    done = outcomes.count("completed")
    print(f"{done}/{len(outcomes)} completed, {len(outcomes) - done} failed — archlab-report {_sweep}", flush=True)
    _sweep = None


class Shown:
    """The messages a sweep has printed, shared by its jobs' processes: a file of their hashes, appended
    under a lock."""

    def __init__(self, path: Path):
        self.path = path
        self.known: set[str] = set()  # printed in this sweep, as far as this process has seen

    def first(self, text: str) -> bool:
        """Whether ``text`` is printed for the first time in the sweep (it is recorded as printed)."""
        key = hashlib.sha1(text.encode()).hexdigest()
        if key in self.known:
            return False
        with open(self.path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            self.known.update(f.read().split())
            new = key not in self.known
            if new:
                f.write(key + "\n")
                self.known.add(key)
        return new


class JobConsole:
    """One job's console: ``sys.stdout``, ``sys.stderr`` and the log handlers writing to them prefix each
    line; log records of other packages' loggers and warnings raised outside archlab print only if
    ``shown`` has not seen their text (the job's own log file, train.log, keeps every record)."""

    def __init__(self, prefix: str, shown: Shown):
        self.prefix, self.shown = prefix, shown
        self._streams: tuple[Any, Any] = (sys.stdout, sys.stderr)
        self._handlers: list[tuple[logging.StreamHandler, Any]] = []
        self._filter = _FirstTime(shown)
        self._showwarning = warnings.showwarning

    def install(self) -> None:
        self._streams = (sys.stdout, sys.stderr)
        out, err = Prefixed(sys.stdout, self.prefix), Prefixed(sys.stderr, self.prefix)
        wrapped = {id(self._streams[0]): out, id(self._streams[1]): err}
        sys.stdout, sys.stderr = out, err
        loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        handlers = {h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers}
        for handler in handlers:
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and id(stream) in wrapped:
                self._handlers.append((handler, handler.setStream(wrapped[id(stream)])))
                handler.addFilter(self._filter)
        self._showwarning = warnings.showwarning
        warnings.showwarning = self._warning

    def uninstall(self) -> None:
        for handler, stream in self._handlers:
            handler.removeFilter(self._filter)
            handler.setStream(stream)
        self._handlers = []
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, Prefixed):
                stream.flush()
        sys.stdout, sys.stderr = self._streams
        warnings.showwarning = self._showwarning

    def _warning(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Optional[TextIO] = None,
        line: Optional[str] = None,
    ) -> None:
        if filename.startswith(ARCHLAB_DIR) or self.shown.first(f"{category.__name__}: {message}"):
            self._showwarning(message, category, filename, lineno, file, line)


class _FirstTime(logging.Filter):
    """Passes archlab's records, and another package's only the first time its text is printed."""

    def __init__(self, shown: Shown):
        super().__init__()
        self.shown = shown

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "archlab" or record.name.startswith("archlab."):
            return True
        return self.shown.first(f"{record.levelname}: {record.getMessage()}")


class Prefixed:
    """A text stream that writes each whole line to ``stream`` as ``prefix + line`` in one write, flushed,
    so lines of parallel jobs sharing a terminal or pipe do not cut into each other. Not a terminal:
    progress is printed as log lines."""

    def __init__(self, stream: Any, prefix: str):
        self.stream, self.prefix = stream, prefix
        self._pending = ""  # the unfinished line
        self._continued = False  # part of it was written out (with the prefix) by flush

    def write(self, text: str) -> int:
        lines = re.split(r"(?<=\n)", self._pending + text)
        self._pending = lines.pop()  # "" after a newline
        if lines:
            head = lines[0] if self._continued else self.prefix + lines[0]
            self.stream.write(head + "".join(self.prefix + line for line in lines[1:]))
            self.stream.flush()
            self._continued = False
        return len(text)

    def flush(self) -> None:
        """Write out an unfinished line too (a prompt, or ``print(..., end="", flush=True)``)."""
        if self._pending:
            self.stream.write(("" if self._continued else self.prefix) + self._pending)
            self._pending, self._continued = "", True
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        """What else a text stream has (``encoding``, ``fileno``, ``buffer``...): the wrapped stream's."""
        if name == "stream":  # not set yet (an instance made without __init__): no wrapped stream to ask
            raise AttributeError(name)
        return getattr(self.stream, name)
