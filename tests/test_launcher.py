"""``hydra/launcher=local``: a job whose worker process dies fails alone; the other jobs run on and the
sweep's last line counts it as failed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from archlab.training.launcher import WorkerDied, run_isolated


def test_a_worker_killed_while_another_runs_fails_its_call_alone(tmp_path):
    """Call 1 SIGKILLs its worker while call 0 still runs: call 0 finishes, call 2 runs in a new worker,
    and call 1's result is a WorkerDied naming the signal (joblib's shared pool aborted them all)."""
    dying = tmp_path / "dying"

    def wait_then(value: int) -> tuple[int, int]:
        for _ in range(200):
            if dying.exists():
                break
            time.sleep(0.05)
        time.sleep(0.3)  # still running when call 1's worker is gone
        return value, os.getpid()

    def die() -> None:
        dying.touch()
        os.kill(os.getpid(), signal.SIGKILL)

    first, died, last = run_isolated([(wait_then, (0,)), (die, ()), (os.getpid, ())], n=2)
    assert isinstance(died, WorkerDied) and "SIGKILL" in str(died)
    assert isinstance(first, tuple) and first[0] == 0 and isinstance(last, int)
    assert len({first[1], last, os.getpid()}) == 3  # three processes: call 2 did not run in call 1's dead one


def test_the_launcher_is_found_where_hydras_scan_misses_it(monkeypatch):
    """Under an editable install Hydra's scan of hydra_plugins misses archlab's launcher (setuptools lists
    no directory for the namespace): ``register`` (archlab-train calls it) hands Hydra the class."""
    from hydra.core.plugins import Plugins
    from omegaconf import OmegaConf

    from archlab.training.launcher import register

    plugins = Plugins.instance()
    name = "hydra_plugins.archlab_launcher.local.IsolatedJoblibLauncher"
    monkeypatch.setattr(
        plugins, "class_name_to_class", {k: v for k, v in plugins.class_name_to_class.items() if k != name}
    )
    node = OmegaConf.create({"_target_": name, "n_jobs": 2})
    with pytest.raises(RuntimeError, match="Unknown plugin class"):
        plugins._instantiate(node)
    register()
    assert type(plugins._instantiate(node)).__name__ == "IsolatedJoblibLauncher"


APP = """\
import os, signal, time
from pathlib import Path

import hydra

from archlab.training.console import end_sweep

@hydra.main(version_base="1.3", config_path=".", config_name="app")
def app(cfg):
    here = Path(cfg.marks)
    if cfg.x == 1:  # dies while job 0 still runs
        (here / "dying").touch()
        os.kill(os.getpid(), signal.SIGKILL)
    for _ in range(600):
        if cfg.x != 0 or (here / "dying").exists():
            break
        time.sleep(0.1)
    time.sleep(0.5)
    return cfg.x

if __name__ == "__main__":
    try:
        app()
    finally:
        end_sweep()
"""

CONFIG = """\
defaults:
  - override hydra/launcher: local
  - _self_
x: 0
marks: {marks}
hydra:
  searchpath: [pkg://archlab.conf]
  callbacks:
    console: {{_target_: archlab.training.console.SweepConsole}}
  sweep: {{dir: {sweep}}}
"""


@pytest.mark.slow  # three worker processes importing archlab (about 30 s on a busy 2-core CPU)
def test_a_sweep_with_a_killed_worker_runs_the_other_jobs_and_counts_it_failed(tmp_path):
    """Job 1 of a ``hydra/launcher=local`` sweep is SIGKILLed while job 0 runs: joblib's shared pool aborted
    job 0 with TerminatedWorkerError and never started job 2 (``0/2 completed, 2 failed``); now jobs 0 and
    2 complete, the sweep names the killed job in one line, and its last line counts 2/3."""
    sweep = tmp_path / "multirun"
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "app.yaml").write_text(CONFIG.format(marks=tmp_path, sweep=sweep))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "app.py"), "-m", "x=0,1,2"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.stdout.splitlines()[-1] == f"2/3 completed, 1 failed — archlab-report {sweep}", proc.stderr[-3000:]
    assert "TerminatedWorkerError" not in proc.stderr and "Traceback" not in proc.stderr
    assert "job 1 (x=1) ended without a result: its worker process died (exit code SIGKILL(-9)" in proc.stderr
    assert proc.returncode != 0


def test_an_interrupt_stops_the_running_calls_and_starts_no_more(tmp_path):
    """Ctrl-C in the launching process (a SIGINT to it alone, the workers left running) kills
    the running workers and starts none of the waiting calls: nothing runs on after the sweep stopped."""
    import threading

    started = tmp_path / "started"
    started.mkdir()

    def work(i: int) -> int:
        (started / str(i)).touch()
        time.sleep(30)
        return i

    def interrupt() -> None:
        for _ in range(600):  # both slots busy
            if len(list(started.iterdir())) == 2:
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    begin = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        run_isolated([(work, (i,)) for i in range(4)], n=2)
    assert time.perf_counter() - begin < 25 and sorted(p.name for p in started.iterdir()) == ["0", "1"]
