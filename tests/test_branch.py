"""Cooldown branches (``branch_from``, archlab/training/branch.py): a wsd run started from a stable run's
checkpoint where its own decay begins ends bit-identical to the wsd run trained from scratch, recording its
tokens; a stable run it would not continue exactly is refused, naming the field, before any training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.training import compose_train

from archlab.config.fields import plain_dict
from archlab.errors import ConfigError
from archlab.training.branch import branch_checkpoint
from archlab.training.run import train
from archlab.weights import load_weights

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

STABLE = [
    "scheduler=constant",
    "scheduler.warmup_steps=2",
    "trainer.max_steps=8",
    "trainer.val_check_interval=8",
    "callbacks.checkpoint.keep=all",
    "callbacks.checkpoint.monitor=null",
    "callbacks.checkpoint.every_n_train_steps=4",
    "callbacks.samples=null",
]
# wsd over 10 steps, its decay the last 20%: steps 8 and 9, so it leaves the stable phase at step 8
BRANCH = [
    "scheduler=wsd",
    "scheduler.warmup_steps=2",
    "scheduler.decay_fraction=0.2",
    "trainer.max_steps=10",
    "trainer.val_check_interval=10",
    "callbacks.checkpoint.keep=last",
    "callbacks.checkpoint.monitor=null",
    "callbacks.checkpoint.every_n_train_steps=4",
    "callbacks.samples=null",
]


def test_a_branch_ends_bit_identical_to_the_wsd_run_it_stands_for(conf, tmp_path):
    train(compose_train(conf, tmp_path / "stable", STABLE))
    branch = train(compose_train(conf, tmp_path / "branch", [*BRANCH, f"branch_from={tmp_path / 'stable'}"]))
    whole = train(compose_train(conf, tmp_path / "whole", BRANCH))
    assert branch["status"] == whole["status"] == "completed" and branch["steps"] == 10
    assert branch["resumed_from"] == str(tmp_path / "stable" / "checkpoints" / "step000008.ckpt")
    assert branch["branch"] == {"from": str(tmp_path / "stable"), "step": 8, "decay_steps": 2}
    assert whole["branch"] is None
    # D: the stable phase's tokens and the cooldown's, 10 steps of 8 sequences of 12
    assert branch["throughput"]["tokens"] == whole["throughput"]["tokens"] == 10 * 8 * 12
    assert branch["metrics"]["final"] == whole["metrics"]["final"]
    ours, theirs = (load_weights(tmp_path / r / "model.safetensors").state_dict() for r in ("branch", "whole"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def fake_stable_run(path: Path, cfg, steps=(4, 8), scheduler=None, optim=None, summary=None) -> None:
    """A stable run's checkpoints as archlab-train writes them, their hyper_parameters from ``cfg`` (the
    non-tensor part is all branch_from reads), and its summary.json's config where ``summary`` gives one."""
    (path / "checkpoints").mkdir(parents=True)
    if summary is not None:
        config = {"data": plain_dict(cfg.data, resolve=True), "seed": cfg.seed, **summary}
        (path / "summary.json").write_text(json.dumps({"status": "completed", "config": config}))
    hparams = {
        "optim": optim or plain_dict(cfg.optim, resolve=True),
        "param": plain_dict(cfg.param, resolve=True),
        "scheduler": scheduler or {"kind": "constant", "warmup_steps": 2},
    }
    for step in steps:
        torch.save({"global_step": step, "hyper_parameters": hparams}, path / "checkpoints" / f"step{step:06d}.ckpt")


def branch_cfg(conf, tmp_path, *extra):
    return compose_train(conf, tmp_path / "branch", [*BRANCH, f"branch_from={tmp_path / 'stable'}", *extra])


def test_the_checkpoint_where_the_decay_begins_is_found_and_checked(conf, tmp_path):
    cfg = branch_cfg(conf, tmp_path)
    fake_stable_run(tmp_path / "stable", cfg)
    assert branch_checkpoint(cfg, tmp_path / "branch") == str(tmp_path / "stable" / "checkpoints" / "step000008.ckpt")
    # a wsd stable run, its decay beyond step 8, holds the same rates before it
    other = tmp_path / "wsd"
    fake_stable_run(
        other,
        cfg,
        scheduler={"kind": "wsd", "warmup_steps": 2, "min_lr_ratio": 0.0, "decay_fraction": 0.2, "decay_steps": 100},
    )
    cfg.branch_from = str(other)
    assert branch_checkpoint(cfg, tmp_path / "branch") == str(other / "checkpoints" / "step000008.ckpt")


@pytest.mark.parametrize(
    ("extra", "stable", "field", "words"),
    [
        (["trainer.max_steps=15"], {}, "branch_from", "a checkpoint at step 12, where this run's decay begins"),
        (["optim.lr=0.01"], {}, "branch_from", "optim.lr: checkpoint 0.001, this run 0.01"),
        (
            [],
            {"scheduler": {"kind": "constant", "warmup_steps": 4}},
            "branch_from",
            "at step 0 its multiplier is 0.2, this run's 0.333333",
        ),
        (["scheduler=cosine"], {}, "scheduler.kind", "wsd with branch_from"),
        (["ckpt_path=x.ckpt"], {}, "branch_from", "null when ckpt_path is given"),
        (["seed=1"], {"summary": {}}, "branch_from", "config.seed: checkpoint 0, this run 1"),
        (["data.batch_size=4"], {"summary": {}}, "branch_from", "data.batch_size: checkpoint 8, this run 4"),
    ],
)
def test_a_stable_run_the_branch_would_not_continue_exactly_is_refused(conf, tmp_path, extra, stable, field, words):
    fake_stable_run(tmp_path / "stable", branch_cfg(conf, tmp_path), **stable)
    cfg = branch_cfg(conf, tmp_path, *extra)
    with pytest.raises(ConfigError) as refused:
        branch_checkpoint(cfg, tmp_path / "branch")
    assert refused.value.field == field and words in refused.value.allowed, refused.value
