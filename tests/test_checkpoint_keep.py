"""Checkpoints on disk: ``last.ckpt`` holds the newest state without a second copy of a kept checkpoint (a
link to it, or a file of its own for a step that is not kept), ``callbacks.checkpoint.keep`` chooses what
else stays, and what reads ``last.ckpt`` (resume=auto, ckpt_path, a sharded directory's swap) follows it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import pytest
import torch
from helpers.training import compose_train

from archlab.errors import ConfigError
from archlab.training.checkpoints import link_checkpoint, replace_dir
from archlab.training.outputs import newest_checkpoint
from archlab.training.run import train

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

STEPS = ["trainer.max_steps=10", "trainer.val_check_interval=5", "callbacks.samples=null"]


def listing(run: Path) -> dict[str, tuple[int, Optional[str]]]:
    """``checkpoints/`` as name -> (the step it holds, the file it links to or None)."""
    return {
        p.name: (torch.load(p, weights_only=True)["global_step"], os.readlink(p) if p.is_symlink() else None)
        for p in sorted((run / "checkpoints").iterdir())
    }


def test_last_links_to_the_checkpoint_it_equals_and_is_a_file_when_that_one_is_not_kept(conf, tmp_path):
    """keep=best_and_last (the default): last.ckpt links to the step-10 checkpoint where that is the best,
    and is a file of its own where the best is step 5's; resume=auto and ckpt_path continue through it."""
    linked = train(compose_train(conf, tmp_path / "linked", STEPS))
    first, second = linked["metrics"]["history"]
    assert second["val/loss"] < first["val/loss"]  # step 10 is the best by val/loss
    assert listing(tmp_path / "linked") == {"last.ckpt": (10, "step000010.ckpt"), "step000010.ckpt": (10, None)}

    own = train(compose_train(conf, tmp_path / "own", [*STEPS, "callbacks.checkpoint.mode=max"]))  # best: step 5
    assert listing(tmp_path / "own") == {"last.ckpt": (10, None), "step000005.ckpt": (5, None)}
    assert own["paths"]["checkpoint"] == str(tmp_path / "own" / "checkpoints" / "step000005.ckpt")
    assert own["paths"]["last_checkpoint"] == str(tmp_path / "own" / "checkpoints" / "last.ckpt")

    more = ["trainer.max_steps=15", "trainer.val_check_interval=5", "callbacks.samples=null"]
    resumed = train(compose_train(conf, tmp_path / "linked", [*more, "resume=auto"]))
    assert resumed["resumed_from"] == str(tmp_path / "linked" / "checkpoints" / "last.ckpt")
    assert [h["step"] for h in resumed["metrics"]["history"]] == [5, 10, 15] and resumed["steps"] == 15
    from_own = [*more, "callbacks.checkpoint.mode=max", f"ckpt_path={tmp_path / 'own/checkpoints/last.ckpt'}"]
    branch = train(compose_train(conf, tmp_path / "branch", from_own))  # a file of its own, read as it is
    assert branch["metrics"]["history"][:2] == own["metrics"]["history"] and branch["steps"] == 15


@pytest.mark.parametrize(
    "keep, expected",
    [
        ("last", {"last.ckpt": (10, None)}),
        ("all", {"last.ckpt": (10, "step000010.ckpt"), "step000005.ckpt": (5, None), "step000010.ckpt": (10, None)}),
    ],
)
def test_keep_chooses_the_checkpoints_a_finished_run_holds(conf, tmp_path, keep, expected):
    """keep=last: one checkpoint file, last.ckpt, which the summary points at and resume=auto continues
    from (still one file after); keep=all: every validation's checkpoint, last.ckpt a link to the newest."""
    summary = train(compose_train(conf, tmp_path, [*STEPS, f"callbacks.checkpoint.keep={keep}"]))
    assert listing(tmp_path) == expected
    if keep == "last":
        assert (
            summary["paths"]["checkpoint"]
            == summary["paths"]["last_checkpoint"]
            == str(tmp_path / "checkpoints" / "last.ckpt")
        )
        more = ["trainer.max_steps=15", "trainer.val_check_interval=5", "callbacks.samples=null", "resume=auto"]
        resumed = train(compose_train(conf, tmp_path, [*more, "callbacks.checkpoint.keep=last"]))
        assert resumed["steps"] == 15 and listing(tmp_path) == {"last.ckpt": (15, None)}


@pytest.mark.parametrize(
    "overrides, field, allowed",
    [
        (["callbacks.checkpoint.keep=best"], "callbacks.checkpoint.keep", "best_and_last (the save_top_k best"),
        (
            ["callbacks.checkpoint.keep=last", "callbacks.checkpoint.save_top_k=3"],
            "callbacks.checkpoint.save_top_k",
            "1 (its default) with callbacks.checkpoint.keep=last",
        ),
        (["+callbacks.checkpoint.save_last=false"], "callbacks.checkpoint.save_last", "unset: last.ckpt is always"),
    ],
)
def test_keep_settings_are_checked_before_any_work(conf, tmp_path, overrides, field, allowed):
    with pytest.raises(ConfigError) as err:
        train(compose_train(conf, tmp_path, overrides))
    assert err.value.field == field and err.value.allowed.startswith(allowed)
    assert not (tmp_path / "checkpoints").exists()


def test_last_swaps_between_a_sharded_directory_and_a_link_whole(tmp_path):
    """FSDP checkpoints are directories: linking last.ckpt replaces a sharded last.ckpt written for an earlier
    step, and a sharded last.ckpt written later (through the staging swap) replaces the link, never its
    target; no temporary name is left."""
    step5, last = tmp_path / "step000005.ckpt", tmp_path / "last.ckpt"
    for directory, text in ((step5, "5"), (last, "3")):
        directory.mkdir()
        (directory / "meta.pt").write_text(text)
    link_checkpoint(step5, last)
    assert last.is_symlink() and os.readlink(last) == "step000005.ckpt" and (last / "meta.pt").read_text() == "5"
    staging = tmp_path / ".last.ckpt.partial"
    staging.mkdir()
    (staging / "meta.pt").write_text("10")
    replace_dir(staging, last)
    assert not last.is_symlink() and (last / "meta.pt").read_text() == "10" and (step5 / "meta.pt").read_text() == "5"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "step000005.ckpt"]


def test_newest_checkpoint_is_last_where_it_links_to_the_newest_and_never_a_dangling_link(tmp_path):
    (tmp_path / "step000010.ckpt").write_text("x")
    (tmp_path / "last.ckpt").symlink_to("step000010.ckpt")  # the same file: the same modification time
    assert newest_checkpoint(tmp_path) == tmp_path / "last.ckpt"
    (tmp_path / "last.ckpt").unlink()
    (tmp_path / "last.ckpt").symlink_to("step000015.ckpt")  # its target deleted by a kill mid-swap
    assert newest_checkpoint(tmp_path) == tmp_path / "step000010.ckpt"
