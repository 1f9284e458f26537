"""One short line for a configuration mistake instead of a traceback (full trace: HYDRA_FULL_ERROR=1)."""

from __future__ import annotations

import functools
import os
import sys
from typing import Callable, TypeVar

from archlab.errors import ConfigError, SweepConfigError

F = TypeVar("F", bound=Callable)


def short_config_errors(task: F) -> F:
    """Wrap a Hydra task function: a ConfigError prints ``error: <message>`` and exits with status 2.

    Applied under ``@hydra.main``, because Hydra reports (and swallows) any other exception itself.
    In a ``-m`` sweep a job's ConfigError is raised on like any failure, so Hydra runs the other jobs
    (an exit would end the sweep); a SweepConfigError, which every job would repeat, still exits.
    A run stopped by a non-finite loss (FloatingPointError, its message naming the step and the last
    good checkpoint) prints the same way and exits with status 1.
    """

    @functools.wraps(task)
    def run(*args, **kwargs):
        try:
            return task(*args, **kwargs)
        except ConfigError as err:
            if os.environ.get("HYDRA_FULL_ERROR") == "1" or (_in_multirun() and not isinstance(err, SweepConfigError)):
                raise
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        except FloatingPointError as err:
            if os.environ.get("HYDRA_FULL_ERROR") == "1" or _in_multirun():
                raise
            print(f"error: {err}", file=sys.stderr)
            sys.exit(1)

    return run  # type: ignore[return-value]


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
