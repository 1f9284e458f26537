"""A short archlab-train fit on each datamodule, composed exactly as the command line composes it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from archlab.build import compose
from archlab.cli.prepare import PrepareConfig, prepare
from archlab.training.run import train

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

TINY = [
    "model.n_layer=2",
    "model.d_model=32",
    "model.attention.n_head=2",
    "logger=none",
    "callbacks.samples=null",
    "scheduler.warmup_steps=10",
    "trainer.log_every_n_steps=10",
    "optim.lr=3e-3",
]
TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune, " * 30


def fit(out: Path, overrides: list[str]) -> dict:
    return train(compose("train", [f"paths.output_dir={out}", *TINY, *overrides], return_hydra_config=True))


def first_and_last(summary: dict, metric: str) -> tuple[float, float]:
    history = summary["metrics"]["history"]
    return history[0][metric], history[-1][metric]


def test_mqar_fit_reports_both_lengths_above_chance(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = fit(
        Path("run"),
        [
            "data=mqar",
            "data.num_pairs=2",
            "data.num_keys=4",
            "data.num_values=8",
            "data.val_examples=128",
            "data.batch_size=32",
            "model.init_std=0.1",
            "trainer.max_steps=60",
            "trainer.val_check_interval=20",
        ],
    )
    assert s["status"] == "completed" and s["data"]["val_names"] == ["val", "val_long"]
    # a relative paths.output_dir is recorded (and printed) absolute, like the checkpoint Lightning names
    for key in ("summary", "export", "checkpoint"):
        assert Path(s["paths"][key]).is_absolute() and Path(s["paths"][key]).is_file(), (key, s["paths"][key])
        assert Path(s["paths"][key]).is_relative_to(tmp_path / "run"), (key, s["paths"][key])
    assert s["model_from_data"] == {"vocab_size": 12, "context_length": 2 * (4 + 4) - 1}
    final = s["metrics"]["final"]
    assert {"val/loss", "val/acc", "val_long/loss", "val_long/acc"} <= final.keys()
    # picking among the values present in the context already doubles the 1/8 of guessing
    assert s["data"]["chance_accuracy"] == 1 / 8 and final["val/acc"] > 2 / 8
    assert final["val/loss"] < math.log(12)


def test_text_fit_lowers_the_full_validation_loss(tmp_path):
    path = tmp_path / "austen.txt"
    path.write_text(TEXT)
    s = fit(
        tmp_path / "run",
        [
            "data=text",
            f"data.path={path}",
            "data.seq_len=32",
            "data.batch_size=16",
            "trainer.max_steps=60",
            "trainer.val_check_interval=20",
        ],
    )
    assert s["model_from_data"] == {"vocab_size": len(set(TEXT)), "context_length": 32}
    assert s["primary_metric"]["name"] == "val/loss"
    first, last = first_and_last(s, "val/loss")
    assert last < first < math.log(len(set(TEXT))) + 0.5 and last < 2.0


def test_text_run_resumed_mid_way_sees_the_same_windows(tmp_path):
    """Resumed from its step-20 checkpoint, a run draws the training windows 20, 21, ... of the stream
    again, so it ends with bit-identical weights; a different seed's stream does not."""
    import torch

    from archlab.weights import load_weights

    path = tmp_path / "austen.txt"
    path.write_text(TEXT)
    common = [
        "data=text",
        f"data.path={path}",
        "data.seq_len=16",
        "data.batch_size=8",
        "trainer.max_steps=40",
        "trainer.val_check_interval=20",
        "callbacks.checkpoint.save_top_k=-1",
    ]
    full = fit(tmp_path / "full", common)
    mid = tmp_path / "full" / "checkpoints" / "step000020.ckpt"
    resumed = fit(tmp_path / "resumed", [*common, f"ckpt_path={mid}"])
    fit(tmp_path / "other", [*common, f"ckpt_path={mid}", "seed=1"])
    assert resumed["metrics"]["history"] == full["metrics"]["history"]
    a, b, c = (load_weights(tmp_path / run / "model.safetensors").state_dict() for run in ("full", "resumed", "other"))
    assert all(torch.equal(a[k], b[k]) for k in a) and not all(torch.equal(a[k], c[k]) for k in a)


def test_tokens_fit_from_prepared_bpe_shards(tmp_path):
    source = tmp_path / "austen.txt"
    source.write_text(TEXT)
    meta = prepare(PrepareConfig(input=str(source), output=str(tmp_path / "shards"), tokenizer="bpe", vocab_size=300))
    s = fit(
        tmp_path / "run",
        [
            "data=tokens",
            f"data.dir={tmp_path / 'shards'}",
            "data.seq_len=16",
            "data.batch_size=16",
            "trainer.max_steps=60",
            "trainer.val_check_interval=20",
        ],
    )
    assert s["model_from_data"] == {"vocab_size": meta["vocab_size"], "context_length": 16}
    first, last = first_and_last(s, "val/loss")
    assert last < first


@pytest.mark.slow  # the built-in default run: about 1-3 minutes on 2 cores
def test_default_run_recalls_at_least_90_percent(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "archlab.cli.train", f"hydra.run.dir={tmp_path}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["choices"]["data"] == "mqar" and summary["metrics"]["final"]["val/acc"] >= 0.9
