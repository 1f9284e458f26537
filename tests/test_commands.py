"""The archlab commands speak one way, run as users run them (the installed console scripts): ``--help``
exits 0 and lists every setting, and a bad setting is one line ``error: <field>=<value> is invalid:
allowed ...`` on stderr with exit status 2."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from archlab.config.commands import (
    AverageConfig,
    BenchConfig,
    CheckConfig,
    CoordConfig,
    EvalConfig,
    GenerateConfig,
    InteropConfig,
    PrepareConfig,
    ReportConfig,
)

SCHEMAS = {
    "archlab-check": CheckConfig,
    "archlab-bench": BenchConfig,
    "archlab-coord": CoordConfig,
    "archlab-generate": GenerateConfig,
    "archlab-prepare": PrepareConfig,
    "archlab-report": ReportConfig,
    "archlab-interop": InteropConfig,
    "archlab-eval": EvalConfig,
    "archlab-average": AverageConfig,
}


def run(command: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name(command)
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("command", SCHEMAS)
def test_help_exits_0_and_lists_every_setting(command, tmp_path):
    proc = run(command, "--help", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith(f"usage: {command} ")
    for f in fields(SCHEMAS[command]):
        if f.name == "model":  # a config group: its options are listed, one per model family
            for group, option in [("model", "gpt2"), ("model/position", "rope"), ("model/attention", "mqa")]:
                # the group's line and the indented lines its options wrap onto
                listed = re.search(rf"^  {group} +(.*(?:\n {{4,}}\S.*)*)", proc.stdout, re.M)
                assert listed and re.search(rf"\b{option}\b", listed.group(1)), group
        elif f.name == "param":  # a config group too: its options
            assert re.search(r"^  param +completep, mup\*, sp$", proc.stdout, re.M)
        else:  # the setting, what it is, and its default
            assert re.search(rf"^  {f.name}\s+\S.*\((default .+|required)\)$", proc.stdout, re.M), f.name
    assert list(tmp_path.iterdir()) == []  # help writes nothing


@pytest.mark.parametrize(
    "command, args, field",
    [
        ("archlab-check", ["model.attention.n_head=5"], "model.attention.n_head"),
        ("archlab-bench", ["warmup=-3"], "warmup"),
        ("archlab-coord", ["widths=[64]"], "widths"),
        ("archlab-generate", ["model.safetensors", "max_new_tokens=abc"], "max_new_tokens"),
        ("archlab-prepare", ["notes.txt", "output=shards", "tokenizer=word"], "tokenizer"),
        ("archlab-report", ["no-such-sweep"], "sweep_dir"),
        ("archlab-interop", ["format=html"], "format"),
        ("archlab-eval", ["no-such-run", "tasks=[arc_easy]", "batch_size=0"], "batch_size"),
        ("archlab-average", ["no-such-run", "last=2"], "run"),
    ],
)
def test_a_bad_setting_is_one_error_line_and_exit_2(command, args, field, tmp_path):
    proc = run(command, *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(rf"error: {re.escape(field)}=\S.* is invalid: allowed \S.*\n", proc.stderr), proc.stderr
