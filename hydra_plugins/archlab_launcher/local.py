"""``hydra/launcher=local``'s class: joblib's launcher, whose jobs ``archlab.training.launcher`` runs each
slot in a worker process of its own (imported at launch: Hydra imports this module at every start)."""

from __future__ import annotations

from typing import Sequence

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher


class IsolatedJoblibLauncher(JoblibLauncher):
    """Runs the jobs ``n_jobs`` at a time, a worker that dies failing its own job alone."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from archlab.training.launcher import launch

        return launch(self, job_overrides, initial_job_idx)
