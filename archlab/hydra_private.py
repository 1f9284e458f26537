"""The private Hydra names archlab relies on, in one place: Hydra offers no public equivalent of either,
and a Hydra release that moves one breaks this module alone. Every other module imports them from here."""

# Hydra's default sweeper: its class path is the ``hydra.sweeper._target_`` a sweep's multirun.yaml
# records, and ``BasicSweeper.split_arguments`` expands a sweep's overrides into its jobs exactly as
# the sweep did (archlab-report lists the planned jobs that never started).
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

# What ``hydra.utils.instantiate`` resolves a ``_target_`` with: checking a node before instantiating it
# must accept and refuse exactly the paths instantiate would (the public ``hydra.utils.get_object`` also
# logs an error for every path it cannot import).
from hydra._internal.utils import _locate as locate

__all__ = ["BasicSweeper", "locate"]
