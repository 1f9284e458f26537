"""The documentation runs: every ``archlab-*`` command line in a ```bash block of README.md and docs/*.md
is carried out in a check-only or tiny form, so a renamed option, field or file fails here.

Each document's bash lines run in order in a fresh working directory (a copy of README.md and
pyproject.toml, which the docs use as sample text), so a line uses what an earlier one made
(``archlab-prepare`` shards, a ``python -c`` model file, a run). A page's sequences run for real: an
``archlab-train`` line whose run or sweep directory (``hydra.run.dir``, ``paths.output_dir``,
``hydra.sweep.dir``) a later line names (a generate, report or export of it, a resumed or continued run)
trains, in tiny form (a few steps, ``tiny_steps``; a sweep through the console script, its seed axis
cut to the first seed), and no stand-in is made for a file inside such a directory: a page whose second
command cannot use what its first produced fails. A study's sweep (``experiment=``) is too large for
that: it is checked as below, and a report after it reads the study's committed runs. How each kind of
line is checked:

- ``archlab-train`` (also ``make train ARGS=...`` and ``python3 scripts/bootstrap.py train ...``): the
  overrides are composed through Hydra's compose API, as the command composes them, and put through
  everything ``train`` checks before Lightning allocates weights: ``validate_train``, the callbacks,
  loggers and datamodule built, the model sized from the data, ``match`` solved, the model validated,
  the objective checked. A ``-m`` line is expanded into jobs of its sweep that between them use every
  value of every swept axis (the command line's and, for Hydra's basic sweeper, the
  ``hydra.sweeper.params`` an experiment sets). A line whose trainer
  asks for more CUDA GPUs than this machine has (``trainer=gpu``, ``trainer.devices=8``) is composed and
  must be refused by exactly that check (``trainer.accelerator`` or ``trainer.devices``).
- ``archlab-bench``: composed, the model validated, the bench's own setting check run, and (with
  ``compare_hf``) the layout mapped to its Hugging Face config; with ``contexts=``, the context sweep's
  setting check, every variant's model validated; nothing is timed.
- ``archlab-check``, ``archlab-generate``, ``archlab-prepare``, ``archlab-report``, ``archlab-export``,
  ``archlab-interop``, ``archlab-average``: run for real, in process. Files they read that no earlier line
  made (nor should have made) are stand-ins made here: a tiny model for ``archlab-generate`` and a safetensors ``archlab-export``, a
  short text for ``data.path=``/``input=``, an empty file for ``ckpt_path=``, a copy of a committed
  study's runs for ``archlab-report``. Absolute paths under /tmp/ are moved into
  the working directory.
- ``--help`` on any command: the installed console script, which must exit 0.
- A line whose comment reads ``# error: <field>=...`` documents a refusal: it must raise the
  ``ConfigError`` naming that field.
- A line choosing an option that the document's own worked example adds (a ```yaml block headed
  ``# model/<family>=<name>`` for an option archlab does not ship) is left to that example's test.
- ``archlab-eval``: run for real, in process, on the tasks of its ``include_path`` and on perplexity; a
  task of lm-eval's own (which downloads its data) must be one of lm-eval's task configs, and the line's
  settings and model are checked without running it.
- A code block whose first line reads ``# file: <path>`` (a task config, its data) is written to that path
  in the working directory, less that line, before the document's lines run.
- ``make <target>`` needs that target in the Makefile, ``python3 scripts/bootstrap.py <cmd>`` that
  command in the script; ``python -c`` lines are executed; ``curl -o FILE`` writes a stand-in text.

Any other ``archlab-*`` line, or an option no rule knows, fails the test. Other lines (pip, venv,
pytest, iconv, ...) are not run.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import unittest.mock
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import unquote

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_LIMIT = 15_000  # bytes
COMMANDS = (
    "archlab-train",
    "archlab-check",
    "archlab-bench",
    "archlab-generate",
    "archlab-prepare",
    "archlab-report",
    "archlab-export",
    "archlab-interop",
    "archlab-eval",
    "archlab-coord",
    "archlab-average",
)
GPU_FIELDS = ("trainer.accelerator", "trainer.devices")
STAND_IN_TEXT = (
    "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n\n"
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name;\n\n"
    "HAMLET:\nTo be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n\n"
) * 60  # about 20 KB: every split holds a window of the default seq_len (256)


# ---------------------------------------------------------------- reading the docs


@dataclass
class Line:
    doc: str
    number: int  # 1-based line number in the document
    text: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.number}: {self.text}"


def bash_lines(path: Path) -> list[Line]:
    """The command lines of every ```bash block (backslash continuations joined, blank lines left out)."""
    lines, inside, pending, start = [], False, "", 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            inside = not inside and stripped[3:].strip() in ("bash", "sh", "shell", "console")
            continue
        if not inside or not stripped:
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(Line(path.relative_to(ROOT).as_posix(), start, pending + stripped))
        pending = ""
    return lines


def words(line: Line) -> tuple[dict[str, str], list[str]]:
    """The environment assignments and the words of a shell line, ``time`` and comments dropped."""
    argv = shlex.split(line.text, comments=True)
    env = {}
    while argv and (argv[0] == "time" or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0])):
        word = argv.pop(0)
        if word != "time":
            key, _, value = word.partition("=")
            env[key] = value
    return env, argv


FILE_BLOCK = re.compile(r"^```\w*\n# file: (\S+)\n(.*?)^```", re.M | re.S)


def files_shown(doc: Path) -> dict[str, str]:
    """The files a document shows whole: each code block headed ``# file: <path>``, that line left out."""
    return dict(FILE_BLOCK.findall(doc.read_text(encoding="utf-8")))


def options_added_by(doc: Path) -> set[str]:
    """``model/<family>=<name>`` choices that a worked example in ``doc`` adds: a ```yaml block headed
    ``# model/<family>=<name>`` for which archlab ships no option file, or a config class registered in a
    ```python block (``@position_config("<name>")``) for an option archlab has not."""
    from archlab.build import CONF_DIR
    from archlab.config import OPTIONS

    text = doc.read_text(encoding="utf-8")
    added = set()
    for header in re.findall(r"```yaml\n#\s*(model/\w+=\w+)", text):
        group, name = header.split("=")
        if not (CONF_DIR / group / f"{name}.yaml").exists():
            added.add(header)
    sections = {"mixer": "attention", "position": "position", "mlp": "mlp"}  # the decorators' sections
    for noun, name in re.findall(r'^@(mixer|position|mlp)_config\("(\w+)"\)', text, re.M):
        if name not in OPTIONS[sections[noun]].classes:
            added.add(f"model/{sections[noun]}={name}")
    return added


def expected_error(line: Line) -> Optional[str]:
    """The field of a documented refusal: ``# error: <field>=...`` in the line's comment."""
    found = re.search(r"\s#\s*error:\s*([\w./+-]+)=", line.text)
    return found.group(1) if found else None


def produced(line: Line) -> list[str]:
    """The directories an ``archlab-train`` line writes that a later line may name: its run or sweep
    directory. None for a study (``experiment=``): its grid is the study's, too large to run here; the
    report after it reads the study's committed runs."""
    _, argv = words(line)
    if argv[:1] != ["archlab-train"] or "experiment" in settings(argv):
        return []
    return produced_dirs(argv)


def produced_dirs(argv: list[str]) -> list[str]:
    keys = ("hydra.run.dir", "paths.output_dir", "hydra.sweep.dir")
    return [value for key, value in settings(argv).items() if key in keys]


def executed(line: Line) -> bool:
    """Whether this test carries the line out (an ``archlab-*`` command, ``make``, ``python -c``)."""
    _, argv = words(line)
    return bool(argv) and (argv[0].startswith("archlab-") or argv[0] == "make" or argv[1:2] == ["-c"])


def consumed(lines: list[Line]) -> set[int]:
    """The line numbers of the training lines whose run or sweep directory a later line that runs names
    (a generate, report or export of it, a resumed or continued run): those run for real, in tiny form."""
    out = set()
    for i, line in enumerate(lines):
        for path in produced(line):
            named = re.compile(rf"(?<![\w/.-]){re.escape(path)}(?![\w.-])")
            if any(named.search(later.text) and executed(later) for later in lines[i + 1 :]):
                out.add(line.number)
    return out


# ---------------------------------------------------------------- the working directory


class Workspace:
    """The directory a document's lines run in: what its commands read and write."""

    def __init__(self, path: Path, added: set[str] = frozenset()):
        self.path = path
        self.added = added  # options the document's own worked example adds
        self.for_real = False  # the line at hand makes what a later line reads: run it for real
        self.made: list[Path] = []  # run and sweep directories of the lines run for real
        for name in ("README.md", "pyproject.toml"):
            shutil.copy(ROOT / name, path / name)

    def local(self, value: str) -> str:
        """A path as the command sees it: absolute /tmp/ paths moved into the workspace."""
        return str(self.path / "tmp" / value[len("/tmp/") :]) if value.startswith("/tmp/") else value

    def localize(self, arg: str) -> str:
        """A command-line word with its path (the whole word, or the value of key=value) localised."""
        key, sep, value = arg.partition("=")
        return key + sep + self.local(value) if sep else self.local(arg)

    def stand_in(self, value: str) -> Optional[Path]:
        """Where to make a stand-in for a file the command reads: None where it exists, or where an
        earlier line's real run should have made it (its absence is the failure to report)."""
        path = self.path / value
        if path.exists() or any(path.resolve().is_relative_to(made) for made in self.made):
            return None
        return path

    def text_file(self, value: str) -> None:
        path = self.stand_in(value)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(STAND_IN_TEXT, encoding="utf-8")

    def empty_file(self, value: str) -> None:
        path = self.stand_in(value)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")

    def model_file(self, value: str, with_tokenizer: bool) -> None:
        """A tiny model (nano's layout, vocabulary and context at 1 layer of width 32) at ``value``."""
        from archlab import build_model, compose_model
        from archlab.tokenizer import ByteTokenizer
        from archlab.weights import save_weights

        path = self.stand_in(value)
        if path is None:
            return
        sizes = ["model=nano", "model.n_layer=1", "model.d_model=32", "model.attention.n_head=2"]
        meta = {"archlab_tokenizer": json.dumps(ByteTokenizer().to_dict())} if with_tokenizer else None
        save_weights(build_model(compose_model(sizes)), path, metadata=meta)

    def sweep_dir(self, value: str) -> None:
        """A sweep's runs: the committed study of the same name, else the MLP study's."""
        path = self.stand_in(value)
        if path is None:
            return
        study = ROOT / "experiments" / Path(value).name / "runs"
        shutil.copytree(study if study.is_dir() else ROOT / "experiments" / "mlp" / "runs", path)


# ---------------------------------------------------------------- one rule per kind of command


def settings(argv: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in argv if "=" in a)


def compose(config: str, overrides: list[str]):
    from archlab.build import compose as archlab_compose

    return archlab_compose(config, overrides, return_hydra_config=True)


def gpus_wanted(trainer) -> int:
    if trainer.accelerator not in ("gpu", "cuda"):
        return 0
    devices = trainer.devices
    if devices == "auto":
        return 1
    return len(devices) if not isinstance(devices, int) else devices


def sweep_points(overrides: list[str], config_params: dict[str, str]) -> list[list[str]]:
    """Jobs of a ``-m`` sweep that between them use every value of every swept axis: the command line's
    sweeps and the config's ``hydra.sweeper.params`` (the command line wins for a key it also sets), as
    Hydra's basic sweeper reads them. As many jobs as the longest axis, values paired in order, rather
    than the whole product: a renamed option or field fails in whichever job uses it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed = parser.parse_overrides(overrides)
    keys = {o.get_key_element() for o in parsed}
    extra = [f"{k}={v}" for k, v in config_params.items() if k not in keys]
    axes = []
    for o in [*parsed, *parser.parse_overrides(extra)]:
        if o.is_sweep_override():
            axes.append([f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()])
        else:
            axes.append([o.input_line])
    jobs = max((len(axis) for axis in axes), default=1)
    return [[axis[i % len(axis)] for axis in axes] for i in range(jobs)]


def train_dry_run(overrides: list[str], ws: Workspace) -> None:
    """What ``archlab-train`` checks before Lightning allocates any weight (see ``training/run.py``)."""
    from omegaconf import OmegaConf

    from archlab.config import to_model_config
    from archlab.nn.validation import validate
    from archlab.training.instantiate import instantiate_node
    from archlab.training.sweep import apply_match, check_objective
    from archlab.training.validation import validate_train

    for key, value in settings(overrides).items():
        if key == "data.path":
            ws.text_file(value)
        elif key == "ckpt_path":
            ws.empty_file(value)
    cfg = compose("train", overrides)
    if gpus_wanted(cfg.trainer) > torch.cuda.device_count():
        with pytest.raises(Exception) as refused:
            validate_train(cfg)
        assert getattr(refused.value, "field", None) in GPU_FIELDS, f"refused for another reason: {refused.value}"
        return
    validate_train(cfg)
    cfg.paths.output_dir = str(ws.path / "outputs" / "dry-run")
    for group in ("callbacks", "logger"):
        for name, node in (cfg[group] or {}).items():
            if node is not None:
                instantiate_node(node, f"{group}.{name}")
    dm = instantiate_node(cfg.data, "data", seed=cfg.seed)
    cfg.model.vocab_size, cfg.model.context_length = int(dm.vocab_size), int(dm.max_seq_len)
    apply_match(cfg)
    validate(to_model_config(cfg.model))
    check_objective(cfg.objective, list(dm.val_names))
    monitor = OmegaConf.select(cfg, "callbacks.checkpoint.monitor", default=None)
    if monitor is not None:
        check_objective(monitor, list(dm.val_names))


def tiny_steps(steps: int) -> int:
    """A documented run's ``trainer.max_steps`` scaled down, keeping their order: a run that continues
    another one's checkpoint for more steps still has steps left."""
    return max(2, int(steps).bit_length())


def tiny(overrides: list[str]) -> list[str]:
    """A documented run (or sweep) in tiny form: a few steps (``tiny_steps``), one validation of two
    batches at the end, no text samples, a checkpoint every step where it sets a checkpoint interval (an
    ``archlab-average`` after it has several); everything else as written."""
    steps = tiny_steps(compose("train", sweep_points(overrides, {})[0]).trainer.max_steps)
    changed = ("trainer.max_steps", "trainer.val_check_interval", "trainer.limit_val_batches", "callbacks.samples")
    values = (steps, steps, 2, "null")
    every = "callbacks.checkpoint.every_n_train_steps"
    if every in settings(overrides):
        changed, values = (*changed, every), (*values, 1)
    kept = [o for o in overrides if o.split("=", 1)[0] not in changed]
    return kept + [f"{key}={value}" for key, value in zip(changed, values)]


def train_for_real(overrides: list[str], ws: Workspace) -> None:
    """One documented run trained in tiny form, in process, as archlab-train runs it (an ``lr_from`` resolved
    first); ``hydra.run.dir`` is its output directory."""
    from archlab.report.proxy import transfer_lr
    from archlab.training.run import train

    for key, value in settings(overrides).items():
        if key == "data.path":
            ws.text_file(value)
    run_dir = [f"paths.output_dir={o.split('=', 1)[1]}" for o in overrides if o.startswith("hydra.run.dir=")]
    cfg = compose("train", tiny([o for o in overrides if not o.startswith("hydra.run.dir=")] + run_dir))
    transfer_lr(cfg)
    train(cfg)


_SWEEPS: dict[tuple[str, ...], Path] = {}  # a sweep run for real, by its command: README and sweeps.md share one


def sweep_for_real(overrides: list[str], ws: Workspace) -> None:
    """A documented ``-m`` sweep run by the console script, as a user runs it, in tiny form and with only
    the first seed of a seed axis (every other axis whole: the report reads its variants). A page that
    repeats another page's sweep gets a copy of its runs."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for key, value in settings(overrides).items():
        if key == "data.path":
            ws.text_file(value)
    jobs = []
    for text, o in zip(overrides, OverridesParser.create().parse_overrides(overrides)):
        if o.get_key_element() == "seed" and o.is_sweep_override():
            text = f"seed={next(iter(o.sweep_string_iterator()))}"
        jobs.append(text)
    script = Path(sys.executable).with_name("archlab-train")
    command = [str(script), "-m", *tiny(jobs)]
    sweep_dir = ws.path / settings(overrides)["hydra.sweep.dir"]
    if tuple(command) in _SWEEPS:
        shutil.copytree(_SWEEPS[tuple(command)], sweep_dir)
        return
    done = subprocess.run(command, cwd=ws.path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0 and re.match(r"(\d+)/\1 completed, 0 failed", last), (
        f"exit {done.returncode}, last line {last!r}: {done.stderr.strip().splitlines()[-1:]}"
    )
    _SWEEPS[tuple(command)] = sweep_dir


def run_train(argv: list[str], ws: Workspace) -> None:
    multirun = bool({"-m", "--multirun"} & set(argv))
    overrides = [a for a in argv if a not in ("-m", "--multirun")]
    unknown = [a for a in overrides if a.startswith("-")]
    assert not unknown, f"no rule for the option(s) {unknown}"
    overrides = [ws.localize(a) for a in overrides]
    if ws.for_real:
        ws.made += [(ws.path / ws.local(path)).resolve() for path in produced_dirs(overrides)]
    if not multirun:
        train_dry_run(overrides, ws)
        if ws.for_real:
            train_for_real(overrides, ws)
        return
    first = compose("train", sweep_points(overrides, {})[0])
    sweeper = first.hydra.sweeper
    basic = str(sweeper.get("_target_", "")).endswith("BasicSweeper")
    params = {k: str(v) for k, v in (sweeper.get("params") or {}).items()} if basic else {}
    for point in sweep_points(overrides, params):
        train_dry_run(point, ws)
    if ws.for_real:
        sweep_for_real(overrides, ws)


def run_bench(argv: list[str], ws: Workspace) -> None:
    from archlab.bench.harness import check_settings
    from archlab.config import to_model_config
    from archlab.nn.validation import validate

    cfg = compose("bench", argv)
    if cfg.contexts is not None:  # the context sweep: its settings and every variant's model checked
        from archlab.bench.context import check_sweep

        check_sweep(cfg)
        return
    model = validate(to_model_config(cfg.model))
    check_settings(cfg, model.context_length)
    if cfg.compare_hf:
        from archlab.interop.hf import config_to_hf

        config_to_hf(model)


def run_coord(argv: list[str], ws: Workspace) -> None:
    from archlab.training.coordcheck import check_settings

    check_settings(compose("coord", argv))


_CHECKS: dict[tuple[str, ...], str] = {}  # the preset table takes seconds: once per distinct command


@functools.cache
def _preset_rows(preset_rows: Callable[[], list[dict]]) -> tuple[dict, ...]:
    """Every preset's report, made once: a table and its json (README.md's, models.md's) print the same rows."""
    return tuple(preset_rows())


def run_check(argv: list[str], ws: Workspace) -> None:
    import archlab.cli.check as check

    if tuple(argv) not in _CHECKS:
        out = io.StringIO()
        made = check.preset_rows

        def rows() -> list[dict]:
            return [dict(row) for row in _preset_rows(made)]

        with contextlib.redirect_stdout(out), unittest.mock.patch.object(check, "preset_rows", rows):
            code = check.run(compose("check", argv), argv)
        assert code == 0, f"exit status {code}:\n{out.getvalue()}"
        _CHECKS[tuple(argv)] = out.getvalue()
    if "format=json" in argv:
        json.loads(_CHECKS[tuple(argv)])


def bare_or_setting(argv: list[str], key: str) -> Optional[str]:
    """The value of ``key=...``, or of the one argument without ``=`` (what the command takes it as)."""
    bare = [a for a in argv if "=" not in a and not a.startswith("-")]
    return settings(argv).get(key) or (bare[0] if bare else None)


def run_exiting(main: Callable, argv: list[str]) -> None:
    """A command's ``main``: its output swallowed, an exit turned into a failure with its message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            main(argv)
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise AssertionError(f"exit status {stop.code}: {err.getvalue().strip()}") from None


def run_generate(argv: list[str], ws: Workspace) -> None:
    from archlab.cli.generate import main

    ckpt = bare_or_setting(argv, "ckpt")
    if ckpt is not None:
        ws.model_file(ckpt, with_tokenizer="prompt" in settings(argv))
    run_exiting(main, [ws.localize(a) for a in argv])


def run_prepare(argv: list[str], ws: Workspace) -> None:
    from archlab.cli.prepare import main

    source = bare_or_setting(argv, "input")
    if source is not None:
        ws.text_file(source)
    run_exiting(main, [ws.localize(a) for a in argv])


def run_report(argv: list[str], ws: Workspace) -> None:
    from archlab.cli.report import main

    sweep_dir = bare_or_setting(argv, "sweep_dir")
    if sweep_dir is not None:
        ws.sweep_dir(sweep_dir)
    run_exiting(main, [ws.localize(a) for a in argv])


def run_export(argv: list[str], ws: Workspace) -> None:
    from archlab.cli.export import main

    source = bare_or_setting(argv, "source")
    if source is not None and source.endswith(".safetensors"):
        ws.model_file(source, with_tokenizer=True)
    run_exiting(main, [ws.localize(a) for a in argv])


TASK_NAME = re.compile(r"^(?:task|group):\s*(\S+)\s*$", re.M)


@functools.cache  # lm-eval's own configs, once: about 12,000 names, a second to read
def task_names(directory: Path) -> set[str]:
    """The lm-eval task and group names the YAML configs under ``directory`` declare."""
    return {name for path in directory.rglob("*.yaml") for name in TASK_NAME.findall(path.read_text(errors="ignore"))}


def run_eval(argv: list[str], ws: Workspace) -> None:
    from unittest import mock

    from archlab.cli.eval import check, main
    from archlab.cli.settings import parse
    from archlab.config.commands import EvalConfig
    from archlab.errors import ConfigError
    from archlab.evaluation.models import read_model

    argv = [ws.localize(a) for a in argv]
    source = bare_or_setting(argv, "source")
    if source is not None and source.endswith(".safetensors"):
        ws.model_file(source, with_tokenizer=True)
    cfg = parse(EvalConfig, argv, bare="source")
    local = (
        task_names(ws.path / cfg.include_path) if cfg.include_path and (ws.path / cfg.include_path).exists() else set()
    )
    downloaded = [task for task in cfg.tasks or [] if task not in local]
    if downloaded:  # lm-eval's own tasks: known to it, the settings and the model checked, not run
        import lm_eval

        known = task_names(Path(lm_eval.__file__).parent / "tasks")
        assert set(downloaded) <= known, f"not tasks of lm-eval: {sorted(set(downloaded) - known)}"
        if cfg.device.startswith("cuda") and not torch.cuda.is_available():  # refused by exactly that check
            with pytest.raises(ConfigError) as refused:
                check(cfg)
            assert refused.value.field == "device", f"refused for another reason: {refused.value}"
            cfg.device = "cpu"
        check(cfg)
        read_model(cfg.source)
        return
    import datasets

    with mock.patch.object(datasets.config, "HF_DATASETS_CACHE", str(ws.path / ".datasets")):
        run_exiting(main, argv)


def run_average(argv: list[str], ws: Workspace) -> None:
    from archlab.cli.average import main

    run_exiting(main, [ws.localize(a) for a in argv])


def run_interop(argv: list[str], ws: Workspace) -> None:
    from archlab.cli.interop import main

    run_exiting(main, [ws.localize(a) for a in argv])


def run_help(command: str) -> None:
    script = Path(sys.executable).with_name(command)
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip(), f"{command} --help: exit {done.returncode}: {done.stderr}"


RULES: dict[str, Callable[[list[str], Workspace], None]] = {
    "archlab-train": run_train,
    "archlab-bench": run_bench,
    "archlab-coord": run_coord,
    "archlab-check": run_check,
    "archlab-generate": run_generate,
    "archlab-prepare": run_prepare,
    "archlab-report": run_report,
    "archlab-export": run_export,
    "archlab-interop": run_interop,
    "archlab-eval": run_eval,
    "archlab-average": run_average,
}


def run_archlab(line: Line, argv: list[str], ws: Workspace) -> None:
    """One ``archlab-*`` command by its rule; a documented refusal must name its field."""
    from archlab.errors import ConfigError

    command, args = argv[0], argv[1:]
    assert command in RULES, f"no rule for {command} (the commands: {', '.join(COMMANDS)})"
    if ws.added & set(args):
        return  # a variant the document shows how to add: its own test (test_architecture_doc.py) builds it
    if "--help" in args or "-h" in args:
        run_help(command)
        return
    field = expected_error(line)
    if field is None:
        RULES[command](args, ws)
        return
    with pytest.raises(ConfigError) as refused:
        RULES[command](args, ws)
    assert refused.value.field == field, f"refused on {refused.value.field}, documented as {field}: {refused.value}"


def makefile_targets() -> set[str]:
    makefile = ROOT / "Makefile"
    assert makefile.is_file(), "the docs run make, and there is no Makefile"
    return set(re.findall(r"^([A-Za-z][\w-]*):", makefile.read_text(), flags=re.M))


def run_line(line: Line, ws: Workspace, monkeypatch) -> None:
    env, argv = words(line)
    if not argv:
        return
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # a ConfigError propagates instead of exiting the process
    try:
        if argv[0].startswith("archlab-"):
            run_archlab(line, argv, ws)
        elif argv[0] == "make":
            targets = [a for a in argv[1:] if "=" not in a and not a.startswith("-")]
            missing = set(targets) - makefile_targets()
            assert not missing, f"no Makefile target {sorted(missing)}"
            make_args = settings(argv[1:]).get("ARGS", "")
            if "train" in targets:
                run_archlab(line, ["archlab-train", *shlex.split(make_args)], ws)
        elif argv[0].startswith("python") and argv[1:2] == ["scripts/bootstrap.py"]:
            script = ROOT / "scripts" / "bootstrap.py"
            assert script.is_file(), "no scripts/bootstrap.py"
            command = argv[2] if len(argv) > 2 else None
            assert command and f'"{command}"' in script.read_text(), f"bootstrap.py has no command {command!r}"
            if command == "train":
                run_archlab(line, ["archlab-train", *argv[3:]], ws)
        elif argv[0].startswith("python") and argv[1:2] == ["-c"]:
            exec(compile(argv[2], str(line), "exec"), {"__name__": "__docs__"})
        elif argv[0] == "curl" and "-o" in argv:
            ws.text_file(argv[argv.index("-o") + 1])
    finally:
        for key in env:
            monkeypatch.delenv(key, raising=False)


# ---------------------------------------------------------------- the tests


pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_documented_commands_run(doc, tmp_path, monkeypatch):
    lines = bash_lines(doc)
    ws = Workspace(tmp_path, options_added_by(doc))
    for name, text in files_shown(doc).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    failures = []
    read_later = consumed(lines)
    for line in lines:
        ws.for_real = line.number in read_later
        try:
            run_line(line, ws, monkeypatch)
        except (Exception, SystemExit, pytest.fail.Exception) as err:  # every failing line is reported
            failures.append(
                f"{line}\n    -> {type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
            )
    assert not failures, f"{len(failures)} documented command(s) fail:\n" + "\n".join(failures)


def test_every_command_kind_is_documented_and_covered():
    """Each console script appears in some bash block, and every documented archlab-* word has a rule."""
    seen = set()
    for doc in DOCS:
        for line in bash_lines(doc):
            _, argv = words(line)
            if argv and argv[0].startswith("archlab-"):
                assert argv[0] in RULES, f"{line}: no rule for {argv[0]}"
                seen.add(argv[0])
    assert seen == set(COMMANDS), f"not documented in any bash block: {sorted(set(COMMANDS) - seen)}"


def test_readme_is_short():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_LIMIT, f"README.md is {size:,} bytes; the limit is {README_LIMIT:,}: move detail to docs/"


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_to_files(doc):
    broken = []
    for number, text in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        for match in LINK.finditer(text):
            target = match.group(1) or match.group(2)
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, or an anchor in the same page
            path = unquote(target.split("#", 1)[0])
            if not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(ROOT)}:{number}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


# Markdown files the code names that are not in the repository: what archlab-report writes into a sweep
OUTPUT_FILES = {"report.md"}


def test_markdown_files_the_code_cites_are_in_the_repository():
    """Every ``*.md`` a comment or docstring of archlab/ or tests/ points to is a file users have (at the
    top level, in docs/ or beside the citing file): tests once cited maintainers' notes that are not in the
    repository, for facts docs/reference.md holds."""
    cited = re.compile(r"[\w./-]+\.md\b")
    missing = []
    for path in sorted([*(ROOT / "archlab").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        homes = (ROOT, ROOT / "docs", path.parent)
        for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in cited.findall(text):
                if name not in OUTPUT_FILES and not any((home / name).exists() for home in homes):
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {name}")
    assert not missing, "Markdown files that are not in the repository:\n" + "\n".join(missing)


def test_reference_counts_in_the_docs_are_the_checked_ones():
    """docs/reference.md's preset table lists every preset archlab-check holds to a count, README.md's shorter
    selection names only shipped presets, and each table gives each published one the count archlab-check
    holds it to."""
    from archlab.cli.check import REFERENCE_COUNTS, presets

    for doc in (ROOT / "README.md", ROOT / "docs" / "reference.md"):
        rows = re.findall(r"^\| `([\w.-]+)` \|(.*)$", doc.read_text(encoding="utf-8"), flags=re.M)
        documented = {}
        for name, rest in rows:
            if name in REFERENCE_COUNTS:
                numbers = [int(n.replace(",", "")) for n in re.findall(r"\b\d{1,3}(?:,\d{3})+\b", rest)]
                documented[name] = numbers
        if doc.name == "reference.md":
            assert set(documented) == set(REFERENCE_COUNTS), f"{doc.name}: presets missing from its table"
        else:
            unknown = {name for name, _ in rows} - set(presets())
            assert documented and not unknown, f"{doc.name}: its preset table names no preset, or unknown ones"
        for name, numbers in documented.items():
            assert REFERENCE_COUNTS[name] in numbers, f"{doc.name}: {name} is not given as {REFERENCE_COUNTS[name]:,}"


def test_the_mixers_and_mlps_fields_in_models_md_are_the_classes():
    """docs/models.md lists each mixer's and MLP's own fields as ``archlab-check --help`` prints them from the
    classes."""
    from archlab.cli.settings import option_fields_lines

    text = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    assert "```text\n" + "\n".join(option_fields_lines()[1:]) + "\n```" in text
