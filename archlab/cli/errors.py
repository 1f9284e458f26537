"""One short line for a configuration mistake instead of a traceback (full trace: HYDRA_FULL_ERROR=1)."""

from __future__ import annotations

import functools
import os
import sys
from typing import Callable, TypeVar

from hydra.errors import CompactHydraException

from archlab.errors import ConfigError, SweepConfigError

F = TypeVar("F", bound=Callable)


class JobFailed(CompactHydraException):
    """A job of a ``-m`` sweep stopped by an error already printed as its one line: Hydra records the job
    as failed, runs the others, and at the end of the sweep exits with status 1 and this short message
    (a compact Hydra exception) rather than a traceback."""


def short_config_errors(task: F) -> F:
    """Wrap a Hydra task function: a ConfigError prints ``error: <message>`` and exits with status 2.

    Applied under ``@hydra.main``, because Hydra reports (and swallows) any other exception itself.
    In a ``-m`` sweep a job's error is printed the same way and the job fails with ``JobFailed``, so Hydra
    runs the other jobs (an exit would end the sweep); a SweepConfigError, which every job would repeat,
    still exits. A run stopped by a non-finite loss (FloatingPointError, its message naming the step and
    the last good checkpoint) prints the same way and exits with status 1.
    """

    @functools.wraps(task)
    def run(*args, **kwargs):
        try:
            return task(*args, **kwargs)
        except (ConfigError, FloatingPointError) as err:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            print(f"error: {err}", file=sys.stderr, flush=True)
            from archlab.training.sweep import in_multirun

            if in_multirun() and not isinstance(err, SweepConfigError):
                raise JobFailed("its error is printed above; every failed job's summary.json records its own") from err
            sys.exit(2 if isinstance(err, ConfigError) else 1)

    return run  # type: ignore[return-value]
