"""How ``hydra/launcher=local`` runs a sweep's jobs: ``n_jobs`` at a time, each slot a one-process loky pool
of its own (reused job after job, as joblib reuses its workers), so a worker that dies (killed, out of
memory, crashed) fails its own job alone; in joblib's one shared pool it broke the pool and aborted every
other job with ``TerminatedWorkerError``. The launcher class is ``hydra_plugins.archlab_launcher.local``'s."""

from __future__ import annotations

import logging
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence, Union

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.errors import CompactHydraException
from hydra_plugins.hydra_joblib_launcher._core import execute_job
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
from joblib.externals.loky import BrokenProcessPool, ProcessPoolExecutor, cpu_count

log = logging.getLogger(__name__)


class WorkerDied(CompactHydraException):
    """A call's worker process ended before it returned: killed, out of memory or crashed (Hydra prints
    the message of a job failed so without a traceback)."""


def slots(n_jobs: int) -> int:
    """How many jobs run at once, as joblib reads ``n_jobs`` (-1 all the CPUs, -2 all but one...)."""
    return n_jobs if n_jobs > 0 else max(cpu_count() + 1 + n_jobs, 1)


def run_isolated(calls: Sequence[tuple[Callable, tuple]], n: int) -> list[Union[Any, WorkerDied]]:
    """Each ``fn(*args)`` of ``calls`` in a worker process, ``n`` at a time, in order: its result, or a
    ``WorkerDied`` naming the worker's exit code where the worker died (the other calls run on)."""
    local = threading.local()  # each slot's pool
    pools: list[ProcessPoolExecutor] = []

    def run(fn: Callable, args: tuple) -> Union[Any, WorkerDied]:
        if getattr(local, "pool", None) is None:
            local.pool = ProcessPoolExecutor(max_workers=1)
            pools.append(local.pool)
        try:
            return local.pool.submit(fn, *args).result()
        except BrokenProcessPool as err:  # its worker died: the slot's next call starts a new one
            local.pool.shutdown(wait=False)
            local.pool = None
            code = re.search(r"exit codes of the workers are \{(.*?)\}", str(err))
            return WorkerDied(f"exit code {code.group(1) if code else 'unknown'}")

    threads = ThreadPoolExecutor(max_workers=n)
    try:
        futures = [threads.submit(run, fn, args) for fn, args in calls]
        return [f.result() for f in futures]
    except BaseException:  # Ctrl-C: no further call starts, and the running ones stop
        threads.shutdown(wait=False, cancel_futures=True)
        for pool in list(pools):
            pool.shutdown(wait=False, kill_workers=True)
        raise
    finally:
        threads.shutdown(wait=True)
        for pool in pools:
            pool.shutdown(wait=True)


def register() -> None:
    """Hand Hydra the launcher class: its scan of ``hydra_plugins`` misses the package under an editable
    install (setuptools' finder maps it, but lists no directory in the namespace to walk), which would
    make ``hydra/launcher=local`` an unknown plugin."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.archlab_launcher.local import IsolatedJoblibLauncher

    Plugins.instance().register(IsolatedJoblibLauncher)


def launch(launcher: JoblibLauncher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
    """Run the jobs as joblib's launcher does, at its ``n_jobs`` (its other settings are for joblib's pool,
    not used), returning each job's result in order, a failed one where the job's worker died."""
    config, task, context = launcher.config, launcher.task_function, launcher.hydra_context
    assert config is not None and task is not None and context is not None
    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    Path(str(config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    n = slots(int(launcher.joblib.get("n_jobs") or 1))
    log.info(f"Launching {len(job_overrides)} jobs, {n} at a time, sweep output dir: {config.hydra.sweep.dir}")
    for idx, overrides in enumerate(job_overrides):
        log.info(f"\t#{initial_job_idx + idx} : {' '.join(filter_overrides(overrides))}")
    state = Singleton.get_state()
    nums = [initial_job_idx + i for i in range(len(job_overrides))]
    calls = [(execute_job, (num, o, context, config, task, state)) for num, o in zip(nums, job_overrides)]
    return [
        died(num, o, r) if isinstance(r, WorkerDied) else r
        for num, o, r in zip(nums, job_overrides, run_isolated(calls, n))
    ]


def died(num: int, overrides: Sequence[str], death: WorkerDied) -> JobReturn:
    """The failed result of job ``num``, whose worker died (Hydra raises its error once every job has run)."""
    error = WorkerDied(
        f"job {num} ({' '.join(filter_overrides(overrides))}) ended without a result: its worker process "
        f"died ({death}: killed, out of memory or crashed); the other jobs ran on"
    )
    return JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=error)
