"""Faults lose nothing: a SIGKILLed run resumes to the exact weights of an uninterrupted one, a kill while
a checkpoint is written leaves the previous one loadable, a NaN stops (or skips) the step before any
weight changes, and a seed fixes every number a run reports."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.faults import Snapshots
from helpers.training import SMALL, compose_train

from archlab.build import compose
from archlab.errors import ConfigError
from archlab.training.checkpoints import AtomicCheckpointIO, check_checkpoint, replace_dir
from archlab.training.outputs import newest_checkpoint
from archlab.training.run import train
from archlab.weights import load_weights

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

TESTS = Path(__file__).parent


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_weights(run / "model.safetensors").state_dict()


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- kill and resume


def test_sigkilled_run_resumes_to_the_uninterrupted_weights_and_loss(conf, tmp_path):
    """archlab-train in a real process, checkpointing every 3 steps, is SIGKILLed once step 9's checkpoint
    exists; resume=auto in the same run directory then ends bit-identical to a run never interrupted."""
    run = tmp_path / "killed"
    common = [
        "trainer.max_steps=21",
        "trainer.val_check_interval=3",
        "callbacks.checkpoint.save_top_k=-1",
        "model.dropout=0.1",
        "callbacks.samples=null",
        "logger=csv",
    ]
    pace = "+callbacks.pace={_target_: helpers.faults.Pace, seconds: 0.2}"  # slow enough to kill mid-run
    env = {**os.environ, "PYTHONPATH": str(TESTS), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "archlab.cli.train",
        f"hydra.searchpath=[file://{conf}]",
        "data=tiny",
        f"hydra.run.dir={run}",
        *SMALL,
        *common,
        pace,
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (run / "checkpoints" / "step000009.ckpt").exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no step-9 checkpoint in time"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert not (run / "model.safetensors").exists() and not (run / "summary.json").exists()
    newest = newest_checkpoint(run / "checkpoints")
    assert newest is not None and torch.load(newest, weights_only=True)["global_step"] in (9, 12)

    resumed = train(compose_train(conf, run, [*common, "resume=auto"]))
    full = train(compose_train(conf, tmp_path / "full", common))
    assert resumed["resumed_from"] == str(newest) and resumed["status"] == full["status"] == "completed"
    assert resumed["steps"] == full["steps"] == 21
    assert resumed["metrics"]["final"] == full["metrics"]["final"]
    assert resumed["metrics"]["history"] == full["metrics"]["history"]  # validations before the kill kept
    assert bitwise_equal(weights(run), weights(tmp_path / "full"))
    # the CSV log too: the rows up to the checkpoint kept, those after it (written before the kill) logged once
    assert csv_rows(run) == csv_rows(tmp_path / "full")
    assert [r["step"] for r in csv_rows(run) if r["val/loss"]] == [str(s - 1) for s in range(3, 22, 3)]


def csv_rows(run: Path) -> list[dict[str, str]]:
    """The rows of ``metrics.csv`` without the timing columns (perf/*)."""
    with (run / "logs" / "metrics.csv").open(newline="") as f:
        return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in csv.DictReader(f)]


# ---------------------------------------------------------------- atomic checkpoint writes


def _killed_while_writing(write) -> None:
    """Run ``write()`` in a forked child whose ``torch.save`` writes half of its bytes, then SIGKILLs it."""
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            real = torch.save

            def half_then_die(obj, f, *args, **kwargs):
                buffer = io.BytesIO()
                real(obj, buffer)
                f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)

            torch.save = half_then_die
            write()
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_a_kill_while_writing_leaves_the_previous_checkpoint_whole(tmp_path):
    path = tmp_path / "checkpoints" / "last.ckpt"
    old = {"global_step": 5, "state_dict": {"w": torch.arange(1000.0)}}
    new = {"global_step": 10, "state_dict": {"w": -torch.arange(1000.0)}}
    io_ = AtomicCheckpointIO()
    io_.save_checkpoint(old, path)

    _killed_while_writing(lambda: io_.save_checkpoint(new, path))
    loaded = torch.load(path, weights_only=True)
    assert loaded["global_step"] == 5 and torch.equal(loaded["state_dict"]["w"], old["state_dict"]["w"])
    leftovers = [p.name for p in path.parent.iterdir() if p != path]
    assert len(leftovers) == 1 and leftovers[0].startswith(".last.ckpt.")  # the half-written temporary file
    assert newest_checkpoint(tmp_path) == path  # resume=auto never picks it

    io_.save_checkpoint(new, path)  # a later complete write replaces the file
    assert torch.load(path, weights_only=True)["global_step"] == 10

    # the same kill during a plain in-place write leaves a file that is refused before training
    def in_place():
        with open(path, "wb") as f:
            torch.save(new, f)

    _killed_while_writing(in_place)
    with pytest.raises(ConfigError) as err:
        check_checkpoint(path, {})
    assert err.value.field == "ckpt_path" and "does not load" in str(err.value)


def test_sharded_checkpoint_directory_is_swapped_in_whole(tmp_path, monkeypatch):
    """FSDP checkpoints are directories, written into a staging directory first: the swap leaves either
    version whole, even when interrupted between its two renames."""
    path, staging = tmp_path / "last.ckpt", tmp_path / ".last.ckpt.partial"
    for directory, text in ((path, "old"), (staging, "new")):
        directory.mkdir()
        (directory / "meta.pt").write_text(text)
    replace_dir(staging, path)
    assert (path / "meta.pt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]

    staging.mkdir()
    (staging / "meta.pt").write_text("newer")
    real, calls = os.replace, []

    def dies_on_second_rename(src, dst):
        calls.append(src)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed between the renames")
        real(src, dst)

    monkeypatch.setattr(os, "replace", dies_on_second_rename)
    with pytest.raises(KeyboardInterrupt):
        replace_dir(staging, path)
    assert (tmp_path / ".last.ckpt.old" / "meta.pt").read_text() == "new"
    assert (staging / "meta.pt").read_text() == "newer"


# ---------------------------------------------------------------- non-finite loss


def test_nan_loss_stops_before_the_step_changes_any_weight(conf, tmp_path):
    Snapshots.made.clear()
    cfg = compose_train(
        conf,
        tmp_path,
        [
            "trainer.max_steps=20",
            "trainer.val_check_interval=5",
            "callbacks.samples=null",
            "+callbacks.poison={_target_: helpers.faults.Poison, loss_step: 8}",
            "+callbacks.snapshots={_target_: helpers.faults.Snapshots}",
        ],
    )
    with pytest.raises(FloatingPointError, match=r"^train/loss is nan at step 8; stopped") as err:
        train(cfg)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert f"Last good checkpoint: {last}" in str(err.value)
    snaps = Snapshots.made[-1]
    assert isinstance(snaps.checkpoint_io, AtomicCheckpointIO)  # the run's checkpoints went through it
    assert bitwise_equal(snaps.at_exception, snaps.after[7])  # step 8 updated nothing
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["global_step"] == 5 and all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "at step 8" in summary["error"] and summary["steps"] == 7


def test_skip_drops_the_non_finite_steps_and_trains_on(conf, tmp_path):
    """Step 4's loss and step 8's gradient are NaN: with action=skip both updates are dropped."""
    Snapshots.made.clear()
    s = train(
        compose_train(
            conf,
            tmp_path,
            [
                "trainer.max_steps=10",
                "trainer.val_check_interval=5",
                "callbacks.samples=null",
                "callbacks.finite_loss.action=skip",
                "+callbacks.poison={_target_: helpers.faults.Poison, loss_step: 4, grad_step: 8}",
                "+callbacks.snapshots={_target_: helpers.faults.Snapshots}",
            ],
        )
    )
    assert s["status"] == "completed" and s["steps"] == 10
    assert s["nonfinite"] == {"action": "skip", "skipped_steps": [4, 8]}
    after = Snapshots.made[-1].after
    assert bitwise_equal(after[4], after[3]) and bitwise_equal(after[8], after[7])
    assert not bitwise_equal(after[5], after[4]) and not bitwise_equal(after[9], after[8])
    assert all(torch.isfinite(v).all() for v in after[10].values())
    assert s["metrics"]["final"]["val/loss"] is not None  # a finite final loss (non-finite is stored as null)


# ---------------------------------------------------------------- determinism

MQAR = [
    "data=mqar",
    "data.num_pairs=2",
    "data.num_keys=8",
    "data.num_values=8",
    "data.val_examples=64",
    "data.batch_size=16",
    "model.n_layer=1",
    "model.d_model=32",
    "model.attention.n_head=2",
    "model.dropout=0.1",
    "scheduler.warmup_steps=2",
    "trainer.max_steps=12",
    "logger=none",
]
VOLATILE = ("start_time", "wall_time_s", "throughput", "paths")  # clocks and where the files went


def mqar_run(out: Path, overrides: list[str]) -> dict:
    """The run's summary without clocks, with its directory written as ``<run>``."""
    summary = train(compose("train", [f"paths.output_dir={out}", *MQAR, *overrides], return_hydra_config=True))
    summary = {k: v for k, v in summary.items() if k not in VOLATILE}
    return json.loads(json.dumps(summary).replace(str(out), "<run>"))


def test_same_seed_same_summary_other_seed_differs(tmp_path):
    a = mqar_run(tmp_path / "a", ["trainer.val_check_interval=4"])
    b = mqar_run(tmp_path / "b", ["trainer.val_check_interval=4"])
    assert a == b and a["status"] == "completed" and len(a["metrics"]["history"]) == 3
    assert bitwise_equal(weights(tmp_path / "a"), weights(tmp_path / "b"))
    # validating more often draws no number from training's random stream: same weights
    mqar_run(tmp_path / "c", ["trainer.val_check_interval=3"])
    assert bitwise_equal(weights(tmp_path / "a"), weights(tmp_path / "c"))
    other = mqar_run(tmp_path / "d", ["trainer.val_check_interval=4", "seed=1"])
    assert other["metrics"]["final"]["val/loss"] != a["metrics"]["final"]["val/loss"]
    assert not bitwise_equal(weights(tmp_path / "a"), weights(tmp_path / "d"))


def test_a_truncated_checkpoint_names_the_newest_earlier_one_that_loads(tmp_path):
    """step 30 cut short (and last.ckpt linking to it): the refusal names step 20, the newest whole one,
    not step 10 (older) nor step 25 (also cut short)."""
    import os

    directory = tmp_path / "checkpoints"
    directory.mkdir()
    for i, step in enumerate((10, 20, 25, 30)):
        path = directory / f"step{step:06d}.ckpt"
        torch.save({"global_step": step, "state_dict": {"w": torch.arange(100.0)}}, path)
        if step in (25, 30):
            path.write_bytes(path.read_bytes()[:200])
        os.utime(path, ns=(i * 10**9, i * 10**9))
    (directory / "last.ckpt").symlink_to("step000030.ckpt")
    for given in ("step000030.ckpt", "last.ckpt"):
        with pytest.raises(ConfigError) as err:
            check_checkpoint(directory / given, {})
        assert err.value.field == "ckpt_path" and "does not load" in str(err.value)
        assert str(err.value).endswith(
            f"the newest checkpoint beside it that loads is {directory / 'step000020.ckpt'} "
            f"(ckpt_path={directory / 'step000020.ckpt'})"
        )
