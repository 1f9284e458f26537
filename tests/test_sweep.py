"""Sweeps: a tiny ``archlab-train -m`` with a failing combination, ``archlab-report`` over it, parameter
matching inside a run, a diverging run recorded as failed, a parallel (joblib) sweep with a bad job,
and a 2-trial Optuna search."""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.report_runs import report
from helpers.training import cli, compose_train, tiny_config_dir

from archlab.accounting import count
from archlab.config import MLP_OPTIONS, to_model_config

pytestmark = pytest.mark.usefixtures("single_thread")

MQAR_YAML = """\
_target_: archlab.data.mqar.MQARDataModule
num_pairs: 2
num_keys: 8
num_values: 8
val_examples: 64
batch_size: 16
"""
STEPS = ["trainer.max_steps=20", "trainer.val_check_interval=10", "callbacks.samples=null", "logger=csv"]


@pytest.fixture(scope="module")
def conf(tmp_path_factory):
    root = tiny_config_dir(tmp_path_factory.mktemp("conf"))
    (root / "data" / "mqar_tiny.yaml").write_text(MQAR_YAML)
    return root


@pytest.fixture(scope="module")
def sweep(conf, tmp_path_factory):
    """2 positions x 2 attentions x 2 seeds on tiny MQAR; gqa's 8 KV heads do not divide 2 heads."""
    tmp = tmp_path_factory.mktemp("sweep")
    sweep_dir = tmp / "multirun"
    proc = cli(
        conf,
        tmp / "run",
        [
            "data=mqar_tiny",
            *STEPS,
            "model/position=learned,rope",
            "model/attention=mha,gqa",
            "seed=0,1",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        multirun=True,
    )
    return sweep_dir, proc


def summaries(sweep_dir: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sweep_dir.glob("*/summary.json")}


HYDRA_FAILURE = ("Error executing job", "its error is printed above", "Set the environment variable HYDRA_FULL")


def job_output(proc: subprocess.CompletedProcess, sweep_dir: Path, jobs: int) -> dict[int, str]:
    """Check what a sweep printed: every line of a job under its ``[job N]`` prefix (the rest is Hydra's:
    its launcher lines, its failure notice), Lightning's hardware lines once for the whole sweep though
    every completed job's train.log keeps them, and a last line counting the jobs as their summaries do.
    Returns each job's text, the prefixes taken off."""
    *lines, last = proc.stdout.splitlines()
    by_job: dict[int, list[str]] = {}
    for line in [*lines, *proc.stderr.splitlines()]:
        head, sep, rest = line.partition("] ")
        if line.startswith("[job ") and sep:
            by_job.setdefault(int(head.removeprefix("[job ")), []).append(rest)
        else:
            assert not line or "][HYDRA]" in line or line.startswith(HYDRA_FAILURE), line
    completed = [d for d, s in summaries(sweep_dir).items() if s["status"] == "completed"]
    failed = jobs - len(completed)
    assert last == f"{len(completed)}/{jobs} completed, {failed} failed — archlab-report {sweep_dir}"
    assert sorted(by_job) == list(range(jobs))  # every job printed, a failed one its error
    text = "\n".join(line for job in by_job.values() for line in job)
    assert text.count("GPU available:") == text.count("TPU available:") == 1 and "LeafSpec" not in text
    assert all("GPU available:" in (sweep_dir / d / "train.log").read_text() for d in completed)
    return {job: "\n".join(job_lines) for job, job_lines in by_job.items()}


def test_every_job_of_the_sweep_ran_and_failures_are_recorded(sweep):
    sweep_dir, proc = sweep
    runs = summaries(sweep_dir)
    assert len(runs) == 8, proc.stderr[-3000:]
    failed = {k: s for k, s in runs.items() if s["status"] == "failed"}
    assert {s["choices"]["model/attention"] for s in failed.values()} == {"gqa"} and len(failed) == 4
    for s in failed.values():
        assert s["error"].startswith("ConfigError: model.attention.n_kv_head=8") and s["stage"] == "setup"
    for s in runs.values():
        if s["status"] == "completed":
            assert s["steps"] == 20 and s["choices"]["model/attention"] == "mha"
    # Hydra runs every job, then reports the failures: a non-zero exit, and no SystemExit killed the sweep
    assert proc.returncode != 0 and "n_kv_head" in proc.stderr


def test_a_sweep_prints_each_jobs_lines_under_its_number_and_ends_with_the_count(sweep):
    """The 8 jobs run one after another: each one's lines under its number (Hydra numbers its directory
    the same), Lightning's hardware lines once, and ``4/8 completed, 4 failed — archlab-report <dir>``."""
    sweep_dir, proc = sweep
    runs = summaries(sweep_dir)
    for job, text in job_output(proc, sweep_dir, jobs=8).items():
        ok = runs[str(job)]["status"] == "completed"
        assert ("final val/acc" in text) == ok and ("error: model.attention.n_kv_head=8" in text) != ok


def test_report_numbers_equal_the_summaries(sweep, tmp_path):
    sweep_dir, _ = sweep
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "archlab.cli.report",
            str(sweep_dir),
            f"out={tmp_path}",
            "metric=val_long/acc",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for name in ("report.md", "report.csv", "curves.png", "final.png"):
        assert (tmp_path / name).stat().st_size > 0
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    assert len(rows) == 4 and list(rows[0])[5] == "final val_long/acc mean"  # --metric leads the table
    runs = summaries(sweep_dir)
    for row in rows:
        group = [
            s
            for s in runs.values()
            if s["choices"]["model/position"] == row["model/position"]
            and s["choices"]["model/attention"] == row["model/attention"]
        ]
        done = [s for s in group if s["status"] == "completed"]
        assert (int(row["runs"]), int(row["completed"]), int(row["failed"])) == (2, len(done), 2 - len(done))
        if not done:
            assert row["final val/acc mean"] == ""
            continue
        for metric in ("val/acc", "val_long/acc", "val/loss"):
            values = [s["metrics"]["final"][metric] for s in done]
            assert float(row[f"final {metric} mean"]) == pytest.approx(statistics.fmean(values), rel=1e-12)
            assert float(row[f"final {metric} std"]) == pytest.approx(statistics.stdev(values), rel=1e-9, abs=1e-15)
        best = [s["metrics"]["best"]["val/loss"]["value"] for s in done]
        assert float(row["best val/loss mean"]) == pytest.approx(statistics.fmean(best), rel=1e-12)
        assert float(row["params total mean"]) == done[0]["parameters"]["analytic"]["total"]
        assert float(row["params total mean"]) == count(to_model_config(done[0]["model"]))["total"]
        # FLOPs per token as trained: 2 pairs + 2 queries are 7 input tokens (val_long's 15 set context_length)
        non_embedding = count(to_model_config(done[0]["model"]))["non_embedding"]
        assert float(row["flops/token mean"]) == pytest.approx(6 * non_embedding + 12 * 1 * 2 * 16 * 7, rel=1e-9)
        assert (
            done[0]["flops_per_token"] == 6 * non_embedding + 12 * 1 * 2 * 16 * 15
        )  # the summary's: at context_length
        assert float(row["KV cache bytes/token mean"]) == 2 * 1 * 2 * 16 * 4  # K and V, 1 layer, 2 heads of 16, fp32
        tps = [s["throughput"]["tokens_per_s"] for s in done]
        assert float(row["tokens/s mean"]) == pytest.approx(statistics.fmean(tps), rel=1e-12)
    md = (tmp_path / "report.md").read_text()
    assert md.count("**failed**") == 4 and md.count("n_kv_head=8") == 4
    table = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if line.startswith("| ")]
    assert table[0] == [
        "model/position",
        "model/attention",
        "seeds",
        "final val_long/acc",  # metric= leads
        "best val_long/acc",
        "params",
        "FLOPs/token",
        "tokens/s",
    ]  # the other figures (val/loss, KV cache bytes, wall time...) are in the CSV only
    for row, cells in zip(rows, table[1:]):
        assert cells[:3] == [row["model/position"], row["model/attention"], f"{row['completed']}/{row['runs']}"]
        # the seeds of a variant have one parameter count: the plain value, no "± 0"
        assert cells[5] == (f"{int(float(row['params total mean'])):,}" if row["params total mean"] else "-")


def test_report_on_a_partial_sweep(sweep, tmp_path):
    """A job still running (no summary yet) is listed, the others still reported."""
    import shutil

    partial = tmp_path / "partial"
    shutil.copytree(sweep[0], partial)
    victim = next(
        p.parent for p in sorted(partial.glob("*/summary.json")) if json.loads(p.read_text())["status"] == "completed"
    )
    (victim / "summary.json").unlink()
    report(partial)
    md = (partial / "report.md").read_text()
    assert "**missing**" in md and victim.name in md
    rows = list(csv.DictReader((partial / "report.csv").open()))
    assert sum(int(r["completed"]) for r in rows) == 3

    # stopped before the rope jobs started: multirun.yaml still says what the sweep was
    from archlab.report.runs import load_runs, swept_axes

    rope = [p.parent.parent for p in partial.glob("*/.hydra/overrides.yaml") if "model/position=rope" in p.read_text()]
    assert len(rope) == 4
    for job in rope:
        shutil.rmtree(job)
    runs = load_runs(partial)
    assert swept_axes(runs) == ["model/position", "model/attention"]
    assert sorted(r.status for r in runs if r.overrides["model/position"] == "rope") == ["not started"] * 4
    report(partial)
    assert (partial / "report.md").read_text().count("**not started**") == 4
    # killed while setting up: only the config files Hydra wrote for it, still pending
    pending = rope[0] / ".hydra.pending"
    pending.mkdir(parents=True)
    (pending / "overrides.yaml").write_text(
        (next(partial.glob("*/.hydra/overrides.yaml")))
        .read_text()
        .replace("model/position=learned", "model/position=rope")
    )
    assert sorted(r.status for r in load_runs(partial) if r.overrides["model/position"] == "rope") == [
        "missing",
        "not started",
        "not started",
        "not started",
    ]
    # a later sweep's multirun.yaml (Hydra rewrites it even when every job is refused) plans other runs
    record = partial / "multirun.yaml"
    record.write_text(record.read_text().replace("model/position=learned,rope", "model/position=alibi,none"))
    runs = load_runs(partial)
    assert len(runs) == 5 and all(r.started for r in runs)  # the 4 learned jobs and the pending rope one


def test_report_refuses_bad_arguments_in_one_line(sweep, tmp_path, capsys):
    """A path that is no sweep, an out that is a file, an unknown metric, an unreadable summary.json, a
    --flag and no sweep at all: one error line each naming the argument, exit 2, and nothing written."""
    import shutil

    from archlab.cli.report import main as report_main

    copy = tmp_path / "copy"
    shutil.copytree(sweep[0], copy)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    broken = tmp_path / "broken"
    shutil.copytree(sweep[0], broken)
    next(broken.glob("*/summary.json")).write_text("{bad")
    for argv, start, reason in [
        ([str(tmp_path / "missing")], "error: sweep_dir=", "nothing is there"),
        ([str(a_file)], "error: sweep_dir=", "this path is a file"),
        ([str(copy), f"out={a_file}"], "error: out=", "this path is a file"),
        (
            [str(copy), "metric=val/bleu"],
            "error: metric='val/bleu'",
            "a final metric of these runs: val/acc, val/loss",
        ),
        ([f"sweep_dir={broken}"], "error: sweep_dir=", "whose summary.json is JSON"),
        ([str(copy), "--out", str(tmp_path)], "error: argument='--out'", "key=value with a key among"),
        ([], "error: sweep_dir=None", "a value (required)"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            report_main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith(start) and reason in err, err
        assert len(err.strip().splitlines()) == 1
    assert not (copy / "report.md").exists()


def test_report_markdown_is_a_compact_table_with_plain_values_for_agreeing_seeds(tmp_path):
    """report.md: axes, seeds, the primary metric final and best, params, FLOPs/token, tokens/s; a value
    the seeds agree on (or one seed's) plain, else mean ± std (std to 2 digits, the mean to its decimal
    place), and (n=k) where fewer completed seeds have the figure."""

    def job(name, overrides, loss=None, tokens_per_s=None):
        run = tmp_path / "sweep" / name
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(json.dumps(overrides))
        summary = {"status": "failed", "error": "ConfigError: boom"}
        if loss is not None:
            summary = {
                "status": "completed",
                "primary_metric": {"name": "val/loss"},
                "metrics": {"final": {"val/loss": loss, "step": 10}, "best": {"val/loss": {"value": loss - 0.1}}},
                "parameters": {"analytic": {"total": 108_224, "non_embedding": 104_192}},
                "wall_time_s": 12.0,
            }
            if tokens_per_s is not None:
                summary["throughput"] = {"tokens_per_s": tokens_per_s, "flops_per_s": 672_768 * tokens_per_s}
        (run / "summary.json").write_text(json.dumps(summary))

    job("0", ["model/mlp=gelu", "seed=0"], 2.0, 1000.0)
    job("1", ["model/mlp=gelu", "seed=1"], 2.1, 1200.0)
    job("2", ["model/mlp=swiglu", "seed=0"], 2.5, 900.0)
    job("3", ["model/mlp=swiglu", "seed=1"])
    job("4", ["model/mlp=geglu", "seed=0"], 2.25, 800.0)
    job("5", ["model/mlp=geglu", "seed=1"], 2.25)  # an older summary, without throughput
    report(tmp_path / "sweep", tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert [line for line in md.splitlines() if line.startswith("|")] == [
        "| model/mlp | seeds | final val/loss | best val/loss | params | FLOPs/token | tokens/s |",
        "|---|---|---|---|---|---|---|",
        # std of (2.0, 2.1) is 0.0707..., of (1000, 1200) 141.4...
        "| gelu | 2/2 | 2.050 ± 0.071 | 1.950 ± 0.071 | 108,224 | 672,768 | 1,100 ± 140 |",
        "| swiglu | 1/2 | 2.5 | 2.4 | 108,224 | 672,768 | 900 |",
        "| geglu | 2/2 | 2.25 | 2.15 | 108,224 | 672,768 (n=1) | 800 (n=1) |",
    ]
    assert "`3` (model/mlp=swiglu, seed=1): **failed** — ConfigError: boom" in md
    header = next(csv.reader((tmp_path / "out" / "report.csv").open()))
    assert {"params non_embedding mean", "wall time (s) mean", "tokens/s std"} <= set(header)  # the rest: CSV


def test_a_resumed_job_stays_in_its_variant_and_curves_follow_the_history(sweep, tmp_path, monkeypatch):
    """A job continued with resume=auto (or from a checkpoint of its own) is the same variant, and its
    curve is the summary history even where the CSV log was started again or points elsewhere; a
    ckpt_path from outside the run is a real difference between runs."""
    import shutil

    import yaml

    from archlab.report.runs import group_variants, load_runs, swept_axes
    from archlab.report.write import validation_curve

    copy = tmp_path / "copy"
    shutil.copytree(sweep[0], copy)
    done = sorted(p.parent for p in copy.glob("*/summary.json") if json.loads(p.read_text())["status"] == "completed")
    resumed, own, other = done[0], done[1], done[2]
    started_in = Path(yaml.safe_load((own / ".hydra" / "hydra.yaml").read_text())["hydra"]["runtime"]["cwd"])
    relative = os.path.relpath(own / "checkpoints" / "last.ckpt", started_in)  # as typed where the run started
    monkeypatch.chdir(tmp_path)  # the report runs elsewhere
    for run, extra in (
        (resumed, "resume=auto"),
        (own, f"ckpt_path={relative}"),
        (other, f"ckpt_path={tmp_path / 'pretrained.ckpt'}"),
    ):
        file = run / ".hydra" / "overrides.yaml"
        file.write_text(yaml.safe_dump([*yaml.safe_load(file.read_text()), extra]))
    (resumed / "logs" / "metrics.csv").write_text("step,val/acc\n19,0.5\n")  # a resumed run's CSV starts again
    runs = load_runs(copy)
    assert swept_axes(runs) == ["model/position", "model/attention", "ckpt_path"]
    assert len(group_variants(runs, swept_axes(runs))) == 5  # 2 x 2 and the one from elsewhere
    for run in runs:
        if run.status == "completed":
            history = run.summary["metrics"]["history"]
            assert validation_curve(run, "val/acc") == [(h["step"], h["val/acc"]) for h in history]
            assert [step for step, _ in validation_curve(run, "val/acc")] == [10, 20]


def test_matched_run_records_the_size_and_residual(conf, tmp_path):
    from archlab.training.run import train

    s = train(
        compose_train(
            conf,
            tmp_path,
            [
                "data=mqar_tiny",
                *STEPS,
                "logger=none",
                "trainer.max_steps=8",
                "model/mlp=swiglu",
                "match.reference={mlp: {kind: gelu}}",
            ],
        )
    )
    m = s["match"]
    # the run's MLP section as gelu: the fields gelu has (its d_ff the default rule), the others left out
    gelu = MLP_OPTIONS.own_fields({**s["model"]["mlp"], "kind": "gelu", "d_ff": None}, "gelu")
    reference = dict(s["model"], mlp=gelu)
    target = count(to_model_config(reference))["total"]
    assert m["target"] == target and m["field"] == "mlp.d_ff" and m["reference"] == {"mlp": {"kind": "gelu"}}
    assert s["model"]["mlp"]["d_ff"] == m["value"] and s["parameters"]["built"]["total"] == m["params"]
    assert abs(m["params"] - target) / target <= 0.005 and m["relative_difference"] == (m["params"] - target) / target
    # the closest d_ff: one step either way is no closer to the target
    for other in (m["value"] - 1, m["value"] + 1):
        moved = dict(s["model"], mlp={**s["model"]["mlp"], "d_ff": other})
        assert abs(count(to_model_config(moved))["total"] - target) >= abs(m["params"] - target)


def test_a_diverging_run_is_recorded_as_failed(conf, tmp_path):
    from archlab.training.run import train

    with pytest.raises(FloatingPointError, match="train/loss is nan"):
        train(
            compose_train(
                conf,
                tmp_path,
                [
                    "data=tiny",
                    "trainer.max_steps=10",
                    "optim.lr=1e30",
                    "scheduler.warmup_steps=0",
                    "trainer.gradient_clip_val=null",
                ],
            )
        )
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "failed" and s["error"].startswith("FloatingPointError") and s["steps"] < 10


def test_optuna_search_config_and_objective(conf, tmp_path):
    """hparams_search=optuna_lr swaps in the Optuna sweeper; the task returns the objective's final value."""
    from archlab.training.sweep import objective_value

    cfg = compose_train(conf, tmp_path, ["hparams_search=optuna_lr"])
    assert cfg.hydra.sweeper._target_.endswith("OptunaSweeper") and cfg.hydra.sweeper.direction == "minimize"
    assert set(cfg.hydra.sweeper.params) == {"optim.lr", "model.init_std"} and cfg.objective == "val/loss"
    summary = {
        "data": {"val_names": ["val", "val_long"]},
        "metrics": {"final": {"val/loss": 1.5, "val_long/acc": 0.25, "val/acc": None}},
    }
    assert objective_value(None, summary) == 1.5 and objective_value("val_long/acc", summary) == 0.25
    assert math.isnan(objective_value("val/acc", summary))  # a non-finite metric: Optuna marks the trial failed


@pytest.mark.slow  # two trials in a subprocess: ~30 s on a busy 2-core CPU
def test_optuna_search_optimises_the_objective(conf, tmp_path):
    """hparams_search=optuna_lr: 2 trials, each returning its final val/loss to the sweeper."""
    sweep_dir = tmp_path / "search"
    proc = cli(
        conf,
        tmp_path / "run",
        [
            "data=tiny",
            "trainer.max_steps=10",
            "trainer.val_check_interval=5",
            "callbacks.samples=null",
            "hparams_search=optuna_lr",
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.n_jobs=1",
            "objective=val/loss",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        multirun=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "setup plugin alembic" not in proc.stdout + proc.stderr  # the log noise of Optuna's alembic import
    runs = summaries(sweep_dir)
    assert len(runs) == 2 and all(s["status"] == "completed" for s in runs.values())
    lrs = {s["config"]["optim"]["lr"] for s in runs.values()}
    assert len(lrs) == 2 and all(1e-4 <= lr <= 3e-2 for lr in lrs)
    best = yaml_load(sweep_dir / "optimization_results.yaml")
    losses = [s["metrics"]["final"]["val/loss"] for s in runs.values()]
    assert best["best_value"] == pytest.approx(min(losses), rel=1e-6)


def yaml_load(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def test_a_bad_setting_fails_its_job_in_one_line_and_the_sweep_runs_the_others(conf, tmp_path, monkeypatch):
    """One job of four with optim.lr=0: it prints ``error: ...`` once (no traceback), records its failure, and
    the other three train; the sweep exits 1. With HYDRA_FULL_ERROR=1 the job's error comes with its trace."""
    sweep_dir = tmp_path / "multirun"
    quick = ["trainer.max_steps=8", "trainer.val_check_interval=8", "callbacks.samples=null"]
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    overrides = [*quick, "optim.lr=1e-3,0,2e-3,3e-3", f"hydra.sweep.dir={sweep_dir}"]
    proc = cli(conf, tmp_path / "run", overrides, multirun=True)
    runs = {s["config"]["optim"]["lr"]: s for s in summaries(sweep_dir).values()}
    assert set(runs) == {1e-3, 0.0, 2e-3, 3e-3}, proc.stderr[-3000:]
    line = "error: optim.lr=0.0 is invalid: allowed a positive number"
    assert [row for row in proc.stderr.splitlines() if "error:" in row] == ["[job 1] " + line]
    assert "Traceback" not in proc.stdout + proc.stderr and proc.returncode == 1
    assert runs[0.0]["status"] == "failed" and runs[0.0]["error"] == "ConfigError: " + line.removeprefix("error: ")
    for lr in (1e-3, 2e-3, 3e-3):
        assert runs[lr]["status"] == "completed" and runs[lr]["steps"] == 8

    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    full = cli(conf, tmp_path / "run", [*quick, "optim.lr=0", f"hydra.sweep.dir={tmp_path / 'full'}"], multirun=True)
    assert full.returncode != 0 and "Traceback" in full.stderr
    assert "archlab.errors.ConfigError: optim.lr=0.0 is invalid: allowed a positive number" in full.stderr


@pytest.mark.slow  # two worker processes (about 30 s): -m slow; test_trackers runs a parallel local sweep by default
def test_a_parallel_local_sweep_records_a_bad_job_and_runs_the_others(conf, tmp_path):
    """``hydra/launcher=local`` (the studies' launcher) sends each job's result back from a worker process:
    a job's ConfigError must survive that trip, so the sweep goes on and the failure is recorded. The two
    worker processes print at once: each line under its job's number, Lightning's hardware lines once,
    and ``2/3 completed, 1 failed — archlab-report <dir>`` last."""
    sweep_dir = tmp_path / "multirun"
    proc = cli(
        conf,
        tmp_path / "run",
        [
            "data=mqar_tiny",
            *STEPS,
            "hydra/launcher=local",
            "model/attention=mha,gqa,mqa",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        multirun=True,
    )
    runs = {s["choices"]["model/attention"]: s for s in summaries(sweep_dir).values()}
    assert set(runs) == {"mha", "gqa", "mqa"}, proc.stderr[-3000:]
    assert runs["mha"]["status"] == runs["mqa"]["status"] == "completed" and runs["mha"]["steps"] == 20
    assert runs["gqa"]["status"] == "failed" and runs["gqa"]["error"].startswith(
        "ConfigError: model.attention.n_kv_head=8"
    )
    assert proc.returncode != 0 and "model.attention.n_kv_head=8" in proc.stderr
    assert "BrokenProcessPool" not in proc.stderr
    printed = job_output(proc, sweep_dir, jobs=3)
    assert printed[1].startswith("error: model.attention.n_kv_head=8")  # gqa, the sweep's job 1
    for job in (0, 2):
        assert f"summary:    {sweep_dir / str(job) / 'summary.json'}" in printed[job]


def test_runs_are_read_in_the_order_the_sweep_planned_them(sweep, tmp_path):
    """Directory names sort apart from the sweep's order (here reversed); the report keeps Hydra's order:
    the first axis outermost, the seed innermost."""
    import itertools
    import shutil

    from archlab.report.runs import load_runs

    copy = tmp_path / "renamed"
    shutil.copytree(sweep[0], copy)
    jobs = sorted((p for p in copy.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    for job in jobs:
        job.rename(copy / f"job{len(jobs) - int(job.name):02d}")
    planned = [
        {"model/position": p, "model/attention": a, "seed": s}
        for p, a, s in itertools.product(("learned", "rope"), ("mha", "gqa"), ("0", "1"))
    ]
    got = [{k: r.overrides[k] for k in ("model/position", "model/attention", "seed")} for r in load_runs(copy)]
    assert got == planned
