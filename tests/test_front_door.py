"""The front door: what ``make train`` / ``make test`` decide before running (scripts/bootstrap.py, nothing
installed here), a short ``archlab-train trainer.max_steps=10`` that fits its warm-up to the run, and the
terminal's progress bar counting steps toward ``trainer.max_steps``."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import logging
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from archlab.build import compose
from archlab.errors import ConfigError
from archlab.training.validation import validate_train

ROOT = Path(__file__).resolve().parent.parent


def _load_bootstrap():
    spec = importlib.util.spec_from_file_location("bootstrap", ROOT / "scripts" / "bootstrap.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bootstrap = _load_bootstrap()

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


# --- scripts/bootstrap.py: the decisions, with nothing installed ---------------------------------------


def test_torch_comes_from_pypi_on_a_gpu_machine():
    assert bootstrap.torch_installs({}, gpu=True) == [["torch==2.13.0"]]


def test_torch_on_a_cpu_machine_tries_the_cpu_index_quickly_then_pypi():
    assert bootstrap.torch_installs({}, gpu=False) == [
        ["torch==2.13.0", "--index-url", CPU_INDEX, "--timeout", "5", "--retries", "0"],
        ["torch==2.13.0"],
    ]


@pytest.mark.parametrize("gpu", [True, False])
def test_the_index_variable_overrides_the_choice(gpu):
    env = {"ARCHLAB_TORCH_INDEX": "https://mirror.example/simple"}
    assert bootstrap.torch_installs(env, gpu=gpu) == [["torch==2.13.0", "--index-url", "https://mirror.example/simple"]]
    assert bootstrap.torch_installs({"ARCHLAB_TORCH_INDEX": "  "}, gpu=gpu) == bootstrap.torch_installs({}, gpu=gpu)


def test_a_gpu_is_an_nvidia_smi_on_the_path():
    assert bootstrap.has_nvidia_gpu(lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None)
    assert not bootstrap.has_nvidia_gpu(lambda name: None)


def test_the_project_is_reinstalled_only_when_missing_or_its_pyproject_or_place_changed(tmp_path):
    root, venv_dir = tmp_path / "clone", tmp_path / "clone" / ".venv"
    venv_dir.mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "archlab"\n')
    assert bootstrap.needs_project_install(venv_dir, root, installed=False)
    assert bootstrap.needs_project_install(venv_dir, root, installed=True)  # installed, but not by bootstrap
    (venv_dir / ".archlab-install").write_text(bootstrap.stamp_text(root))
    assert not bootstrap.needs_project_install(venv_dir, root, installed=True)
    assert bootstrap.needs_project_install(venv_dir, root, installed=False)  # uninstalled since
    (root / "pyproject.toml").write_text('[project]\nname = "archlab"\ndependencies = ["rich"]\n')
    assert bootstrap.needs_project_install(venv_dir, root, installed=True)

    moved = tmp_path / "moved"  # the same pyproject.toml in another checkout: the editable install points away
    moved.mkdir()
    shutil.copy(root / "pyproject.toml", moved / "pyproject.toml")
    (venv_dir / ".archlab-install").write_text(bootstrap.stamp_text(root))
    assert bootstrap.needs_project_install(venv_dir, moved, installed=True)


def _fake_setup(monkeypatch, tmp_path, has: dict[str, bool], pip_codes: list[int], uv_codes=()) -> list[list[str]]:
    """``bootstrap.setup`` on a venv whose Python exists, with the probes, pip and uv replaced: returns the
    install calls it makes, each ``[tool, *args]`` and answered by the next code of ``pip_codes`` or
    ``uv_codes``."""
    root, venv_dir = tmp_path / "clone", tmp_path / "clone" / ".venv"
    (venv_dir / "bin").mkdir(parents=True, exist_ok=True)
    (venv_dir / "bin" / "python").touch()
    (root / "pyproject.toml").write_text('[project]\nname = "archlab"\n')
    calls: list[list[str]] = []
    uv_left = list(uv_codes)

    def pip(python, args):
        calls.append(["pip", *args])
        return pip_codes.pop(0)

    def uv(python, args):
        calls.append(["uv", *args])
        return uv_left.pop(0)

    def probe(python, code):
        return has["torch"] if "'torch'" in code else has["archlab"]

    monkeypatch.setattr(bootstrap, "_pip", pip)
    monkeypatch.setattr(bootstrap, "_uv", uv)
    monkeypatch.setattr(bootstrap, "_has", probe)
    monkeypatch.setattr(bootstrap, "has_nvidia_gpu", lambda: False)
    monkeypatch.setattr(bootstrap, "venv_bin", lambda d, name: d / "bin" / name)
    monkeypatch.delenv("ARCHLAB_TORCH_INDEX", raising=False)
    bootstrap.setup(venv_dir, root)
    return calls


def test_setup_falls_back_to_pypi_then_a_second_call_installs_nothing(monkeypatch, tmp_path):
    calls = _fake_setup(monkeypatch, tmp_path, {"torch": False, "archlab": False}, [1, 0, 0], uv_codes=[0])
    assert calls == [
        ["pip", "torch==2.13.0", "--index-url", CPU_INDEX, "--timeout", "5", "--retries", "0"],
        ["pip", "torch==2.13.0"],
        ["pip", "uv"],
        ["uv", "--compile-bytecode", "-e", ".[dev]"],
    ]
    assert _fake_setup(monkeypatch, tmp_path, {"torch": True, "archlab": True}, []) == []


@pytest.mark.parametrize("pip_uv, uv_codes", [(1, []), (0, [1])], ids=["no uv", "uv fails"])
def test_the_project_installs_with_pip_where_uv_cannot(monkeypatch, tmp_path, pip_uv, uv_codes):
    calls = _fake_setup(monkeypatch, tmp_path, {"torch": True, "archlab": False}, [pip_uv, 0], uv_codes)
    assert calls[0] == ["pip", "uv"] and calls[-1] == ["pip", "-e", ".[dev]"]
    assert len(calls) == 2 + len(uv_codes)


def test_setup_stops_when_torch_cannot_be_installed(monkeypatch, tmp_path):
    with pytest.raises(SystemExit, match="could not install torch==2.13.0"):
        _fake_setup(monkeypatch, tmp_path, {"torch": False, "archlab": False}, [1, 1])


def test_the_test_command_is_lint_format_typecheck_then_pytest():
    assert bootstrap.suite_commands(["-k", "warmup"]) == [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["basedpyright", "--project", "."],
        ["python", "-m", "pytest", "-q", "-n", "auto", "--dist", "loadfile", "--no-loadscope-reorder", "-k", "warmup"],
    ]


def test_the_explore_command_runs_the_property_tests_on_new_draws():
    """``make explore``: the property tests alone under Hypothesis' "explore" profile (random, more examples),
    a worker per test, then the caller's pytest arguments; ``make test`` keeps the derandomised default."""
    assert bootstrap.COMMANDS["explore"](["-k", "kv_cache"]) == [
        ["python", "-m", "pytest", "-q", "-n", "3", "--hypothesis-profile=explore", "tests/test_properties.py"]
        + ["-k", "kv_cache"]
    ]
    assert not any("--hypothesis-profile" in arg for cmd in bootstrap.suite_commands() for arg in cmd)


def _outside_make(**extra: str) -> dict[str, str]:
    """This environment without what a make around the tests passes down (MAKEFLAGS, MAKELEVEL... under
    ``make test``), nor the Makefile's own variables: the commands below run as from a plain shell."""
    leaked = ("MAKEFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MFLAGS", "PYTHON", "ARGS")
    return {**{k: v for k, v in os.environ.items() if k not in leaked}, **extra}


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_targets_call_the_script_with_args():
    def dry(*args):
        return subprocess.run(
            ["make", "-n", *args], cwd=ROOT, env=_outside_make(), capture_output=True, text=True, check=True
        ).stdout.strip()

    assert dry("train", "ARGS=trainer.max_steps=10") == "python3 scripts/bootstrap.py train trainer.max_steps=10"
    assert dry("test", "ARGS=-k warmup") == "python3 scripts/bootstrap.py test -k warmup"
    assert dry("explore", "ARGS=-k kv_cache") == "python3 scripts/bootstrap.py explore -k kv_cache"
    for target in ("test", "explore", "setup", "lint", "format", "typecheck"):
        assert dry(target) == f"python3 scripts/bootstrap.py {target}"


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_alone_lists_every_target():
    shown = subprocess.run(["make"], cwd=ROOT, env=_outside_make(), capture_output=True, text=True, check=True).stdout
    targets = [line.split()[1] for line in shown.splitlines()]
    assert targets == ["help", "train", "test", "explore", "setup", "lint", "format", "typecheck"]


def test_each_make_target_is_a_script_command():
    """What the Makefile hands the script, the script knows (and nothing else: it refuses the rest)."""
    assert set(bootstrap.COMMANDS) | {"train"} == {"setup", "train", "test", "explore", "lint", "format", "typecheck"}
    assert bootstrap.COMMANDS["lint"]([]) == [["ruff", "check", "."], ["ruff", "format", "--check", "."]]
    assert bootstrap.COMMANDS["typecheck"]([]) == [["basedpyright", "--project", "."]]
    assert bootstrap.main(["deploy"]) == 2


def _ci_run(tmp_path, path: str) -> tuple[str, str]:
    """``bash .ci/run`` from another directory with ``path`` as PATH, behind a stand-in python3 that records
    where it ran, its arguments and MAKELEVEL (set by make for what it runs)."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f'#!/bin/sh\necho "$PWD|$*|$MAKELEVEL" > {tmp_path / "called"}\n')
    fake.chmod(0o755)
    env = _outside_make(PATH=f"{fake.parent}{os.pathsep}{path}" if path else str(fake.parent), CI="true")
    subprocess.run([shutil.which("bash") or "/bin/bash", str(ROOT / ".ci" / "run")], cwd=tmp_path, env=env, check=True)
    where, args, level = (tmp_path / "called").read_text().strip().split("|")
    return f"{where} {args}", level


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_ci_runs_make_test_as_the_readme_says(tmp_path):
    """Where make is installed, CI runs ``make test`` itself (make's child sees MAKELEVEL 1), from the
    repository root, whatever make around it started it."""
    assert _ci_run(tmp_path, os.environ["PATH"]) == (f"{ROOT} scripts/bootstrap.py test", "1")
    assert "make test" in (ROOT / "README.md").read_text().split("```bash", 1)[1].split("```")[0]


def test_ci_runs_the_script_where_make_is_missing(tmp_path):
    """A PATH holding nothing but python3: the script that ``make test`` runs, directly."""
    assert _ci_run(tmp_path, "") == (f"{ROOT} scripts/bootstrap.py test", "")


def test_the_commit_hooks_and_hosted_ci_check_what_make_test_checks():
    """pre-commit's ruff is the revision the dev extra pins (two ruff versions format differently), its hooks are the
    lint, format and YAML checks, and the hosted workflow runs the README's ``make test``."""
    import tomllib
    import yaml

    hooks = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"]
    ruff = next(r for r in hooks if r["repo"].endswith("/ruff-pre-commit"))
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert f"ruff=={ruff['rev'].removeprefix('v')}" in dev
    ids = {h["id"] for r in hooks for h in r["hooks"]}
    assert {"ruff-check", "ruff-format", "check-yaml"} <= ids
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    assert [step.get("run") for job in workflow["jobs"].values() for step in job["steps"] if "run" in step] == [
        "make test"
    ]


# --- the warm-up follows the run ------------------------------------------------------------------------


def _train_cli(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "archlab.cli.train", f"hydra.run.dir={run_dir}", *overrides]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_a_ten_step_run_shortens_the_default_warmup(tmp_path):
    run = tmp_path / "run"
    proc = _train_cli(run, "trainer.max_steps=10", "trainer.log_every_n_steps=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "scheduler.warmup_steps: 100 -> 1 (a tenth of trainer.max_steps=10" in proc.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 10
    assert summary["config"]["scheduler"]["warmup_steps"] == 1
    lr = {
        int(r["step"]): float(r["train/lr"])
        for r in csv.DictReader(open(run / "logs" / "metrics.csv"))
        if r["train/lr"]
    }
    peak, floor = 1e-3, 0.1
    assert lr[0] == pytest.approx(peak * 1 / 2)  # warm-up of 1 step: (0 + 1) / (1 + 1)
    assert lr[1] == pytest.approx(peak)  # then the cosine from its peak over the 9 remaining steps
    assert lr[4] == pytest.approx(peak * (floor + (1 - floor) / 2 * (1 + math.cos(math.pi * 3 / 9))))


def test_a_warmup_set_on_the_command_line_is_still_an_error(tmp_path):
    proc = _train_cli(tmp_path / "run", "scheduler.warmup_steps=50", "trainer.max_steps=10")
    assert proc.returncode == 2
    assert "scheduler.warmup_steps=50 is invalid: allowed fewer than trainer.max_steps=10" in proc.stderr + proc.stdout
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_warmup_fits_an_explicit_decay_and_an_experiments_value(tmp_path, caplog):
    cfg = compose("train", ["scheduler.decay_steps=40", f"paths.output_dir={tmp_path}"], return_hydra_config=True)
    with caplog.at_level(logging.INFO, logger="archlab.train"):
        validate_train(cfg)
    assert cfg.scheduler.warmup_steps == 4
    assert "scheduler.warmup_steps: 100 -> 4 (a tenth of scheduler.decay_steps=40" in caplog.text

    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "long.yaml").write_text("# @package _global_\nscheduler: {warmup_steps: 500}\n")
    overrides = [f"hydra.searchpath=[file://{conf}]", "experiment=long", "trainer.max_steps=20"]
    cfg = compose("train", [*overrides, f"paths.output_dir={tmp_path}"], return_hydra_config=True)
    assert cfg.scheduler.warmup_steps == 500  # the experiment's, made for a longer run
    validate_train(cfg)
    assert cfg.scheduler.warmup_steps == 2


def test_a_warmup_that_fits_is_left_alone(tmp_path):
    cfg = compose("train", ["trainer.max_steps=101", f"paths.output_dir={tmp_path}"], return_hydra_config=True)
    validate_train(cfg)
    assert cfg.scheduler.warmup_steps == 100


def test_without_the_command_line_a_warmup_counts_as_chosen(tmp_path):
    cfg = compose("train", ["trainer.max_steps=10", f"paths.output_dir={tmp_path}"])  # no hydra node: origin unknown
    with pytest.raises(ConfigError) as err:
        validate_train(cfg)
    assert err.value.field == "scheduler.warmup_steps"


# --- the terminal's progress bar --------------------------------------------------------------------------


@pytest.fixture
def rich_console():
    """Lightning's rich bar reconfigures rich's global console; put it back afterwards."""
    import rich

    saved = rich.get_console().__dict__
    yield
    rich.get_console().__dict__ = saved


@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")
def test_the_bar_counts_steps_to_max_steps_shows_validation_and_keeps_log_lines_above(
    rich_console, monkeypatch, tmp_path
):
    import lightning as L
    import torch
    from helpers.training import TinyData

    from archlab.config import model_config_dict, to_model_config
    from archlab.nn.validation import validate
    from archlab.training.callbacks import StepProgress
    from archlab.training.module import LitModel

    class Probe(L.Callback):
        """After the bar's update of each batch: the step, the bar's (completed, total, description)."""

        def __init__(self):
            self.seen = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            task = bar.progress.tasks[bar.train_progress_bar_id]
            self.seen.append((trainer.global_step, task.completed, task.total, task.description.strip()))
            if trainer.global_step == 3 and batch_idx % 2 == 1:
                logging.getLogger("archlab.test").warning("a log line at step 3")

    raw = io.StringIO()  # the terminal as the log handler knew it
    monkeypatch.setattr(sys, "stdout", raw)
    handler = logging.StreamHandler(raw)
    logging.getLogger().addHandler(handler)
    screen = io.StringIO()
    bar = StepProgress(console_kwargs={"file": screen, "force_terminal": True, "width": 160, "color_system": None})
    probe = Probe()
    model = compose("train", ["model.n_layer=1", "model.d_model=32", "model.attention.n_head=2"]).model
    model.vocab_size, model.context_length = 16, 12
    lit = LitModel(
        model=model_config_dict(validate(to_model_config(model))),
        optim={"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3, "weight_decay": 0.1},
        scheduler={"kind": "cosine", "warmup_steps": 1, "min_lr_ratio": 0.1, "decay_steps": None},
    )
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=6,
        max_epochs=-1,
        accumulate_grad_batches=2,  # 12 batches: the bar counts the 6 optimizer steps
        val_check_interval=4,
        check_val_every_n_epoch=None,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[bar, probe],
        default_root_dir=str(tmp_path),
    )
    try:
        torch.manual_seed(0)
        trainer.fit(lit, datamodule=TinyData())
    finally:
        logging.getLogger().removeHandler(handler)

    assert len(probe.seen) == 12
    assert [(c, t, d) for _, c, t, d in probe.seen] == [(step, 6, "Training") for step, *_ in probe.seen]
    assert [step for step, *_ in probe.seen] == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6]
    text = screen.getvalue()
    final = text[text.rindex("Training") :]
    assert "6/6" in final and "Epoch" not in text
    latest = lit.history[-1]
    assert latest["step"] == 6
    assert f"val/loss: {latest['val/loss']:.3f}" in final and f"val/acc: {latest['val/acc']:.3f}" in final
    # the log line went through the bar's console, above it, and the handler has its stream back
    assert "a log line at step 3" in text and "a log line at step 3" not in raw.getvalue()
    assert handler.stream is raw
