"""One short line for a configuration mistake instead of a traceback (full trace: HYDRA_FULL_ERROR=1)."""

from __future__ import annotations

import functools
import os
import sys
from typing import Callable, TypeVar

from archlab.errors import ConfigError

F = TypeVar("F", bound=Callable)


def short_config_errors(task: F) -> F:
    """Wrap a Hydra task function: a ConfigError prints ``error: <message>`` and exits with status 2.

    Applied under ``@hydra.main``, because Hydra reports (and swallows) any other exception itself.
    """

    @functools.wraps(task)
    def run(*args, **kwargs):
        try:
            return task(*args, **kwargs)
        except ConfigError as err:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)

    return run  # type: ignore[return-value]
