"""data=mixture: each batch shared among the sources by weight, a pure function of (seed, step); one
tokenizer for all sources, refused otherwise before any shard is read; per-source validation; the realised
tokens recorded; a resumed run bit-identical; the report's per-source columns."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from archlab.data.allocation import Allocation
from archlab.data.mixture import MixtureDataModule, MixtureStream
from archlab.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# each source's ids lie in its own range, so a row's source is read off its tokens
RANGES = {"a": (0, 80), "b": (80, 160), "c": (160, 256)}
BYTE = {"kind": "byte"}


def write_source(directory: Path, ids: tuple[int, int], train: int = 3000, val: int = 301, tokenizer=BYTE) -> Path:
    """A shard directory as archlab-prepare writes it (byte vocabulary unless ``tokenizer``), its ids drawn
    from ``[ids[0], ids[1])``."""
    rng = np.random.default_rng(ids[0])
    directory.mkdir(parents=True)
    for split, n in (("train", train), ("val", val)):
        rng.integers(*ids, n).astype("<u2").tofile(directory / f"{split}.bin")
    meta = {"vocab_size": 256, "dtype": "uint16", "tokenizer": tokenizer, "train_tokens": train, "val_tokens": val}
    (directory / "meta.json").write_text(json.dumps(meta))
    return directory


@pytest.fixture
def sources(tmp_path) -> dict[str, Path]:
    return {name: write_source(tmp_path / name, ids) for name, ids in RANGES.items()}


def mixture(sources: dict[str, Path], **weights: float) -> dict:
    return {name: {"dir": str(sources[name]), "weight": w} for name, w in weights.items()}


def source_of(rows: torch.Tensor) -> list[str]:
    """The source each row was cut from, by its first token's range."""
    return [next(n for n, (lo, hi) in RANGES.items() if lo <= int(t) < hi) for t in rows[:, 0]]


def weyl_bound(batches: Any) -> Any:
    """The most that ``batches`` batches of the allocation can stray from a source's share, in rows: its
    leftover rows are the points of the golden-ratio sequence in an arc of the circle, and that sequence's
    discrepancy is ``N·D_N <= 3 + (1/ln φ + 1/ln 2) ln N`` (Kuipers & Niederreiter, Uniform Distribution of
    Sequences, ch. 2 §3, partial quotients at most 1); twice that, to cover an arc that wraps around."""
    phi = (1 + math.sqrt(5)) / 2
    return 2 * (3 + (1 / math.log(phi) + 1 / math.log(2)) * np.log(batches))


@pytest.mark.parametrize(
    "weights, rows",
    [((3, 1), 8), ((3, 1), 7), ((0.5, 0.3, 0.2), 32), ((1, 1, 1), 1), ((1000, 1, 7), 16), ((0.1, 0.9), 3)],
)
def test_each_batch_gives_floor_or_ceil_of_the_share_and_the_totals_follow_the_weights(weights, rows):
    shares = [w / sum(weights) for w in weights]
    allocation = Allocation(list(weights), rows, seed=3)
    batches = 5000
    counts = allocation.counts(np.arange(batches))
    assert (counts.sum(axis=1) == rows).all()
    for i, share in enumerate(shares):
        assert set(np.unique(counts[:, i])) <= {math.floor(rows * share), math.ceil(rows * share)}
    # every prefix of the stream stays within the sequence's discrepancy bound of its share
    prefix = counts.cumsum(axis=0)
    expected = np.arange(1, batches + 1)[:, None] * rows * np.array(shares)[None, :]
    assert (np.abs(prefix - expected)[1:] <= weyl_bound(np.arange(2, batches + 1))[:, None]).all()
    assert np.abs(prefix - expected).max() < 4  # measured: the bound is loose (docs/data.md)
    assert (allocation.totals(batches) == prefix[-1]).all()  # the chunked count equals the batch-by-batch one
    assert (allocation.rows_of(1234) == counts[1234]).all()


def test_whole_shares_are_exact_in_every_batch():
    """3:1 of 8 rows is 6 and 2, every batch, whatever the seed."""
    for seed in range(3):
        assert (Allocation([3, 1], 8, seed).counts(np.arange(100)) == [6, 2]).all()


def test_the_leftover_row_goes_to_each_source_as_often_as_its_remainder():
    """Over uniform offsets (the limit of the Weyl sequence), a source gets its extra row as often as its
    fractional quota: 0.5/0.3/0.2 of 7 rows are 3.5, 2.1 and 1.4, so 3, 2 and 1 rows plus one more row
    (R = 0.5 + 0.1 + 0.4) that goes to them with probabilities 0.5, 0.1 and 0.4."""
    allocation = Allocation([0.5, 0.3, 0.2], 7, seed=0)
    grid = (np.arange(10_000) + 0.5) / 10_000
    counts = []
    for u in grid:
        allocation.start = float(u)  # batch 0's offset
        counts.append(allocation.rows_of(0))
    assert np.allclose(np.mean(counts, axis=0), [3.5, 2.1, 1.4], atol=1e-9)


def test_batches_are_a_pure_function_of_seed_and_step_and_follow_the_weights(sources):
    def stream(seed=0, batch_size=8, world=1, rank=0):
        dm = MixtureDataModule(mixture(sources, a=5, b=2, c=1), seq_len=12, batch_size=batch_size, seed=seed)
        return MixtureStream(dm.train_batches(), seed, batch_size, rank, world)

    one, again, other = stream(), stream(), stream(seed=1)
    first = one.batch(17)
    assert all(torch.equal(x, y) for x, y in zip(first, again.batch(17)))
    assert not torch.equal(first[0], other.batch(17)[0]) and not torch.equal(first[0], one.batch(18)[0])
    # two processes with 4 rows each see the one process's 8 rows of each batch
    halves = [stream(batch_size=4, world=2, rank=r).batch(17) for r in (0, 1)]
    assert torch.equal(torch.cat([h[0] for h in halves]), first[0])
    assert torch.equal(torch.cat([h[1] for h in halves]), first[1])
    inputs, targets = first
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # windows of consecutive tokens
    # realised rows per source: 5/8, 2/8, 1/8 of 8 rows are whole, so exactly 5, 2, 1 in every batch
    for k in range(40):
        rows = source_of(one.batch(k)[0])
        assert [rows.count(n) for n in "abc"] == [5, 2, 1]
    assert len(set(tuple(source_of(one.batch(k)[0])) for k in range(10))) > 1  # rows in a seeded order


def test_realised_fractions_of_uneven_shares_follow_the_weights(sources):
    """Weights 3:2 of 6 rows (3.6 and 2.4): each batch 3 or 4 rows of a, the totals within the bound."""
    dm = MixtureDataModule(mixture(sources, a=3, b=2), seq_len=8, batch_size=6, seed=5)
    stream = MixtureStream(dm.train_batches(), 5, 6)
    batches = 300
    counts = np.array([[source_of(stream.batch(k)[0]).count(n) for n in "ab"] for k in range(batches)])
    assert set(counts[:, 0]) == {3, 4} and (counts.sum(axis=1) == 6).all()
    assert abs(counts[:, 0].sum() - batches * 6 * 3 / 5) <= weyl_bound(batches)
    assert (counts.sum(axis=0) == Allocation([3, 2], 6, 5).totals(batches)).all()


def test_validation_scores_each_source_apart_and_pools_them(sources):
    dm = MixtureDataModule(mixture(sources, b=1, a=2), seq_len=30, batch_size=4)
    assert dm.val_names == ["val", "val/a", "val/b"] and dm.val_pools == {"val": ["val/a", "val/b"]}
    assert dm.vocab_size == 256 and dm.max_seq_len == 30 and dm.tokenizer.to_dict() == BYTE
    loaders = dm.val_dataloader()
    for loader, name in zip(loaders, "ab"):
        rows = torch.cat([x for x, _ in loader])
        assert len(rows) == -(-300 // 30) and set(source_of(rows)) == {name}  # 300 targets in windows of 30


@pytest.mark.parametrize(
    "given, field, says",
    [
        ({}, "data.mixture", "a mapping"),
        ({"a": {"dir": "A", "weight": 0}}, "data.mixture.a.weight", "positive"),
        ({"a": {"dir": "A", "weight": -2}}, "data.mixture.a.weight", "positive"),
        ({"a": {"dir": "A", "weight": "heavy"}}, "data.mixture.a.weight", "positive"),
        ({"a": {"dir": "A"}}, "data.mixture.a.weight", "a value"),
        ({"a": {"weight": 1}}, "data.mixture.a.dir", "a value"),
        ({"a": {"dir": "A", "weight": 1, "wieght": 2}}, "data.mixture.a.wieght", "dir, weight"),
        ({"a.b": {"dir": "A", "weight": 1}}, "data.mixture", "letters, digits"),
        ({"a": {"dir": "nowhere", "weight": 1}}, "data.mixture.a.dir", "archlab-prepare"),
        ({"a": {"dir": "A", "weight": 1}, "b": {"dir": "A/.", "weight": 1}}, "data.mixture.b.dir", "a names it"),
        ({"a": {"dir": "A", "weight": 1}, "r": {"dir": "RAW", "weight": 1}}, "data.mixture.r.dir", "meta.json"),
    ],
)
def test_a_bad_mixture_is_refused_naming_the_field(sources, tmp_path, monkeypatch, given, field, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "A").symlink_to(sources["a"])
    write_source(tmp_path / "RAW", (0, 10)).joinpath("meta.json").unlink()
    with pytest.raises(ConfigError) as err:
        MixtureDataModule(given, seq_len=8)
    assert err.value.field == field and says in str(err.value), str(err.value)


def test_sources_of_two_tokenizers_are_refused_naming_both_before_any_shard_is_read(sources, tmp_path, monkeypatch):
    chars = write_source(
        tmp_path / "chars", (0, 50), tokenizer={"kind": "char", "chars": "".join(map(chr, range(256)))}
    )

    def scanned(*args):
        raise AssertionError("a shard was read before the tokenizers were compared")

    monkeypatch.setattr("archlab.data.tokens.largest_id", scanned)
    with pytest.raises(ConfigError) as err:
        MixtureDataModule({"web": {"dir": str(sources["a"]), "weight": 1}, "zh": {"dir": str(chars), "weight": 1}})
    message = str(err.value)
    assert err.value.field == "data.mixture.zh.dir"
    assert "source web" in message and "zh was made with char (256 ids" in message and "web with byte" in message


def test_a_source_too_short_for_a_window_is_named_by_its_own_field(sources, tmp_path):
    short = write_source(tmp_path / "short", (0, 10), train=5, val=5)
    with pytest.raises(ConfigError) as err:
        MixtureDataModule(mixture({**sources, "short": short}, a=1, short=1), seq_len=8)
    assert err.value.field == "data.seq_len" and str(short) in str(err.value)


def test_documents_ended_by_other_eos_ids_are_refused(sources):
    for name, eos in (("a", 3), ("b", 90)):
        meta = json.loads((sources[name] / "meta.json").read_text())
        (sources[name] / "meta.json").write_text(json.dumps({**meta, "eos_id": eos}))
    MixtureDataModule(mixture(sources, a=1, b=1), seq_len=8)  # no document mask: the ids are not read
    with pytest.raises(ConfigError) as err:
        MixtureDataModule(mixture(sources, a=1, b=1), seq_len=8, document_mask=True)
    assert err.value.field == "data.mixture.b.dir" and "id 3" in str(err.value) and "90" in str(err.value)


TINY = [
    "model.n_layer=1",
    "model.d_model=16",
    "model.attention.n_head=2",
    "logger=csv",
    "callbacks.samples=null",
    "callbacks.checkpoint.save_top_k=-1",
    "scheduler.warmup_steps=2",
    "trainer.log_every_n_steps=1",
    "trainer.max_steps=6",
    "trainer.val_check_interval=3",
    "data=mixture",
    "data.seq_len=16",
    "data.batch_size=5",
]


def test_a_mixture_run_records_its_tokens_validates_each_source_and_resumes_bit_identical(sources, tmp_path):
    import csv

    from archlab.build import compose
    from archlab.training.run import train
    from archlab.weights import load_weights

    given = json.dumps(mixture(sources, a=3, c=1)).replace('"', "")

    def fit(out: str, *more: str) -> dict:
        overrides = [f"paths.output_dir={tmp_path / out}", *TINY, f"data.mixture={given}", "callbacks.ema.decay=0.5"]
        overrides += more
        return train(compose("train", overrides, return_hydra_config=True))

    full = fit("full")
    resumed = fit("resumed", f"ckpt_path={tmp_path / 'full' / 'checkpoints' / 'step000003.ckpt'}")
    assert resumed["metrics"]["history"] == full["metrics"]["history"]
    a, b = (load_weights(tmp_path / run / "model.safetensors").state_dict() for run in ("full", "resumed"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # 3:1 of 5 rows is 3.75 and 1.25: over 6 batches, the allocation's own totals, recorded as such
    rows = Allocation([3, 1], 5, 0).totals(6).tolist()
    for summary in (full, resumed):
        recorded = summary["mixture"]["sources"]
        assert summary["mixture"]["batches"] == 6 and [recorded[n]["rows"] for n in "ac"] == rows
        assert [recorded[n]["tokens"] for n in "ac"] == [16 * r for r in rows] and sum(rows) == 30
        assert recorded["a"]["share"] == 0.75 and recorded["a"]["dir"] == str(sources["a"])
    # val pools every validation token of both sources: the mean of theirs weighted by the 300 each scores
    final = full["metrics"]["final"]
    assert final["val/loss"] == pytest.approx((final["val/a/loss"] + final["val/c/loss"]) / 2, rel=1e-5)
    assert final["val/a/loss"] != final["val/c/loss"]
    ema = full["ema"]["final"]  # the weights' average validated on the same sets, pooled the same way
    assert ema["val/loss"] == pytest.approx((ema["val/a/loss"] + ema["val/c/loss"]) / 2, rel=1e-5)
    assert ema["val/a/loss"] != final["val/a/loss"]
    with open(next((tmp_path / "full" / "logs").rglob("metrics.csv"))) as f:
        logged = [row for row in csv.DictReader(f) if row["mixture/a/tokens"]]
    assert [float(row["mixture/a/tokens"]) for row in logged][-1] == 16 * rows[0]


def test_the_report_table_shows_each_source_s_loss():
    from archlab.report.write import table_columns

    columns = ["final val/loss", "best val/loss", "final val/a/loss", "final val/a/acc", "final val_long/loss"]
    assert list(table_columns(columns, [{}])) == ["final val/loss", "best val/loss", "final val/a/loss"]


@pytest.mark.slow  # two runs, one of them two processes (about a minute on 2 cores): -m slow
def test_two_processes_train_on_the_mixture_one_process_does_with_their_rows_together(sources, tmp_path):
    """DDP over gloo with 3 rows per process draws the batches of one process with 6 rows: the same rows per
    source, recorded alike, and the same validation figures (pooled and per source) to float tolerance."""
    import os
    import subprocess
    import sys

    given = json.dumps(mixture(sources, a=3, b=1)).replace('"', "")
    common = [*TINY, f"data.mixture={given}", "logger=none"]
    script = Path(sys.executable).with_name("archlab-train")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {"one": ["data.batch_size=6"], "two": ["trainer=ddp_cpu", "trainer.devices=2", "data.batch_size=3"]}
    for name, more in runs.items():
        command = [str(script), *common, *more, f"paths.output_dir={tmp_path / name}"]
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
    one, two = (json.loads((tmp_path / name / "summary.json").read_text()) for name in runs)
    assert one["mixture"] == two["mixture"] and two["trainer"]["world_size"] == 2
    rows = Allocation([3, 1], 6, 0).totals(6).tolist()
    assert [two["mixture"]["sources"][n]["rows"] for n in "ab"] == rows
    final_one, final_two = one["metrics"]["final"], two["metrics"]["final"]
    assert final_one.keys() == final_two.keys() >= {"val/loss", "val/a/loss", "val/b/loss"}
    assert all(final_two[k] == pytest.approx(final_one[k], rel=1e-4) for k in final_one)
