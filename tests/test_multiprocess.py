"""Two CPU processes over gloo: DDP (spawned in-process, and the CLI's ddp_cpu) and FSDP2 (the CLI's fsdp).

Both ranks must end with identical weights, and a 2-process run with batch 4 per rank must match a
single process with batch 8 (the same global batch, see tests/helpers/training.py) to within
``TOLERANCE``: the gradient all-reduce sums in another order, and ten Adam steps carry the rounding on.
Validation losses must match too, with a row count that does not divide among the processes.
Lightning's ``ddp`` and ``ModelParallelStrategy`` launchers re-run ``sys.argv``, which under pytest
is pytest itself, so those two are tested through the CLI in a subprocess.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.training import cli, compose_train

from archlab.weights import load_weights

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

TOLERANCE = 1e-5  # max |w_2proc - w_1proc| after 10 steps (lr 1e-3); measured 1.5e-6 (weights ~1)
# 33 validation rows: 17 per process at batch 4, rank 1's last batch only padding; each row scored once
# RoPE (half pairs: the projection reordered in training, kept in order for decoding) under DDP and FSDP2
STEPS = [
    "trainer.max_steps=10",
    "trainer.val_check_interval=5",
    "model.n_layer=2",
    "data.val_examples=33",
    "model/position=rope",
]


def _ranks(dirpath: str) -> str:
    return "+callbacks.ranks={_target_:helpers.training.SaveRankWeights,dirpath:" + dirpath + "}"


@pytest.fixture(scope="module")
def single(conf, tmp_path_factory):
    """The single-process reference: batch 8, the same steps."""
    from archlab.training.run import train

    out = tmp_path_factory.mktemp("single")
    summary = train(compose_train(conf, out, [*STEPS, "data.batch_size=8"]))
    return load_weights(out / "model.safetensors").state_dict(), summary


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _check_ddp(out: Path, single) -> None:
    ranks = [torch.load(out / "ranks" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])  # identical on both ranks
    exported = load_weights(out / "model.safetensors").state_dict()
    assert all(torch.equal(exported[k], ranks[0][k]) for k in ranks[0])
    reference, single_summary = single
    assert _max_diff(exported, reference) < TOLERANCE
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer"]["world_size"] == 2 and summary["steps"] == 10
    for a, b in zip(summary["metrics"]["history"], single_summary["metrics"]["history"]):
        assert a["step"] == b["step"] and abs(a["val/loss"] - b["val/loss"]) < 1e-4


def test_ddp_spawn_in_process_matches_one_process(conf, tmp_path, single):
    from archlab.training.run import train

    sharing = (
        "+callbacks.sharing={_target_:helpers.training.SaveMetricSharing,dirpath:" + str(tmp_path / "sharing") + "}"
    )
    summary = train(
        compose_train(
            conf,
            tmp_path,
            [
                *STEPS,
                "trainer=ddp_spawn",
                "trainer.accelerator=cpu",
                "data.batch_size=4",
                _ranks(str(tmp_path / "ranks")),
                sharing,
            ],
        )
    )
    assert summary["trainer"]["strategy"] == "DDPStrategy"
    _check_ddp(tmp_path, single)
    # spawning hands both processes the module's tensors in one shared memory; metric states added to
    # there by both at once lose updates (a first val/loss of 1.86 against 2.46, seen under load)
    records = sorted((tmp_path / "sharing").iterdir())
    assert [p.name for p in records] == [
        "rank0_step10.json",
        "rank0_step5.json",
        "rank1_step10.json",
        "rank1_step5.json",
    ]
    assert not any(json.loads(p.read_text()) for p in records)


@pytest.mark.slow  # two processes (about 25 s): -m slow; test_ddp_spawn_in_process_matches_one_process keeps DDP in the default run
def test_ddp_cpu_cli_matches_one_process(conf, tmp_path, single):
    proc = cli(conf, tmp_path, [*STEPS, "trainer=ddp_cpu", "data.batch_size=4", _ranks(str(tmp_path / "ranks"))])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "train_ddp_process_1.log").exists()  # a second process really ran
    _check_ddp(tmp_path, single)


@pytest.mark.slow  # two processes (about 50 s): -m slow
def test_fsdp_cli_shards_trains_and_resumes_from_its_sharded_checkpoint(conf, tmp_path, single):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    common = [*STEPS, "trainer=fsdp", "data.batch_size=4", "callbacks.checkpoint.save_top_k=-1"]
    samples = ["data.with_tokenizer=true", "callbacks.samples.prompt_tokens=3", "callbacks.samples.max_new_tokens=4"]
    proc = cli(conf, full, [*common, *samples, _ranks(str(full / "ranks"))])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((full / "summary.json").read_text())
    assert summary["trainer"]["strategy"] == "AtomicModelParallelStrategy" and summary["trainer"]["world_size"] == 2
    # decoding a sharded model: every rank runs the forward passes together
    assert [len(s["completion"]) for s in summary["samples"]] == [4, 4]
    # each rank holds a shard of every parameter; together exactly the whole model
    shards = [torch.load(full / "ranks" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    total = summary["parameters"]["built"]["total"]
    held = [sum(t.numel() for t in s.values()) for s in shards]
    assert sum(held) == total and max(held) < 0.6 * total
    # the checkpoint is sharded: a directory with one file per process
    mid = full / "checkpoints" / "step000005.ckpt"
    assert mid.is_dir() and len(list(mid.glob("*.distcp"))) == 2
    assert not list((full / "checkpoints").glob(".*"))  # each written to a staging dir, then swapped in
    last = full / "checkpoints" / "last.ckpt"  # a link to the newest sharded directory, not a copy of it
    assert last.is_symlink() and last.resolve() == (full / "checkpoints" / "step000010.ckpt").resolve()
    # it learned like the single process with the same global batch
    exported = load_weights(full / "model.safetensors").state_dict()
    assert _max_diff(exported, single[0]) < TOLERANCE
    # and resuming from the sharded step-5 checkpoint ends where the uninterrupted run ended
    proc = cli(conf, resumed, [*common, f"ckpt_path={mid}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = load_weights(resumed / "model.safetensors").state_dict()
    assert all(torch.equal(again[k], exported[k]) for k in exported)
    history = json.loads((resumed / "summary.json").read_text())["metrics"]["history"]
    assert history == summary["metrics"]["history"]
