"""data=text: the 90/10 split, char/byte vocabularies, random windows, full validation coverage, errors."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from archlab.data import TextDataModule
from archlab.data.stream import RankPadded, batch_rng
from archlab.data.windows import ValidationWindows, random_windows
from archlab.errors import ConfigError


@pytest.fixture
def text_file(tmp_path):
    # 1000 characters; "Z" and "!" occur only in the last 10%, so a vocabulary fitted on the
    # training part alone would miss them
    body = ("abcdefghij klmnop\n" * 60)[:900] + ("ZZ!" * 40)[:100]
    path = tmp_path / "t.txt"
    path.write_text(body, encoding="utf-8")
    return path, body


def test_char_split_is_the_first_90_percent_exactly(text_file):
    path, body = text_file
    dm = TextDataModule(str(path), vocab="char", seq_len=16)
    dm.setup()
    assert dm.vocab_size == len(set(body)) and dm.tokenizer.chars == "".join(sorted(set(body)))
    assert dm.tokenizer.decode(dm.train_data.tolist()) == body[:900]
    assert dm.tokenizer.decode(dm.val_data.tolist()) == body[900:]
    assert dm.max_seq_len == 16 and dm.val_names == ["val"] and dm.chance_accuracy is None


def test_split_fraction_is_configurable(text_file):
    path, body = text_file
    dm = TextDataModule(str(path), seq_len=8, val_fraction=0.25)
    dm.setup()
    assert len(dm.train_data) == 750 and len(dm.val_data) == 250


def test_byte_vocabulary_splits_bytes_and_round_trips(tmp_path):
    body = "héllo wörld ✓ " * 30  # multi-byte characters: 14 characters, 18 bytes per repeat
    path = tmp_path / "u.txt"
    path.write_text(body, encoding="utf-8")
    dm = TextDataModule(str(path), vocab="byte", seq_len=8)
    dm.setup()
    raw = body.encode("utf-8")
    assert dm.vocab_size == 256 and len(raw) == 18 * 30
    cut = int(len(raw) * 0.9)
    assert dm.train_data.tolist() == list(raw[:cut]) and dm.val_data.tolist() == list(raw[cut:])
    assert dm.tokenizer.decode(dm.train_data.tolist() + dm.val_data.tolist()) == body


@pytest.mark.parametrize("n,seq_len", [(100, 9), (100, 7), (100, 10), (65, 64), (129, 64), (130, 64)])
def test_validation_windows_score_every_token_once(n, seq_len):
    data = np.arange(1000, 1000 + n)  # token i of the split has id 1000 + i
    windows = ValidationWindows(data, seq_len)
    assert len(windows) == -(-(n - 1) // seq_len)  # ceil((n - 1) / seq_len)
    scored = []
    for i in range(len(windows)):
        x, y = windows[i]
        start = int(x[0]) - 1000
        assert torch.equal(x, torch.arange(start, start + seq_len) + 1000)  # a contiguous slice
        assert torch.equal(y[y != -100], torch.arange(start + 1, start + seq_len + 1)[y != -100] + 1000)
        if i < (n - 1) // seq_len:
            assert start == i * seq_len and (y != -100).all()  # the full windows do not overlap
        scored += (y[y != -100] - 1000).tolist()
    assert sorted(scored) == list(range(1, n))  # every token after the first, each exactly once


@pytest.mark.parametrize("world", [2, 3])
def test_validation_across_processes_scores_every_token_once(world):
    """Each process's slice (as Lightning's DistributedSampler cuts it) of the rank-padded windows:
    together every token once, and the same number of rows on every process."""
    from torch.utils.data import DistributedSampler

    n, seq_len = 92, 7  # 13 windows: not a multiple of 2 or 3
    windows = ValidationWindows(np.arange(1000, 1000 + n), seq_len)
    padded = RankPadded(windows, world)
    scored, rows = [], []
    for rank in range(world):
        sampler = DistributedSampler(padded, num_replicas=world, rank=rank, shuffle=False)
        targets = [padded[i][1] for i in sampler]
        rows.append(len(targets))
        scored += [t - 1000 for y in targets for t in y[y != -100].tolist()]
    assert sorted(scored) == list(range(1, n)) and len(set(rows)) == 1
    # the sampler padding real rows instead repeats the first windows' tokens on the last processes
    unpadded = [
        t
        for r in range(world)
        for i in DistributedSampler(windows, world, r, shuffle=False)
        for t in windows[i][1][windows[i][1] != -100].tolist()
    ]
    assert len(unpadded) > n - 1


def test_validation_loader_pads_only_under_several_processes(text_file):
    path, _ = text_file
    dm = TextDataModule(str(path), seq_len=16, batch_size=3)
    dm.setup()
    assert not isinstance(dm.val_dataloader()[0].dataset, RankPadded)  # no trainer: one process
    dm.trainer = SimpleNamespace(world_size=2)
    loader = dm.val_dataloader()[0]
    assert isinstance(loader.dataset, RankPadded) and len(loader.dataset) % 2 == 0


def test_validation_loader_reads_the_windows_in_order(text_file):
    path, _ = text_file
    dm = TextDataModule(str(path), seq_len=16, batch_size=3)
    dm.setup()
    (loader,) = dm.val_dataloader()
    rows = torch.cat([x for x, _ in loader])
    expected = torch.stack([ValidationWindows(dm.val_data, 16)[i][0] for i in range(len(rows))])
    assert len(rows) == 7 and torch.equal(rows, expected)  # 99 targets: 6 full windows of 16, one tail window


def test_val_long_reads_the_validation_split_in_longer_windows(text_file):
    """eval_seq_len: a second validation set, val_long, of the same 99 targets in windows of 40 (two full,
    one tail window scoring the last 19), and the model's context covers it."""
    path, _ = text_file
    dm = TextDataModule(str(path), seq_len=16, batch_size=2, eval_seq_len=40)
    dm.setup()
    assert dm.val_names == ["val", "val_long"] and dm.max_seq_len == 40
    short, long = dm.val_dataloader()
    assert len(torch.cat([x for x, _ in short])) == 7
    inputs, targets = (torch.cat(t) for t in zip(*long))
    assert inputs.shape == (3, 40)
    ids = torch.from_numpy(dm.val_data.astype(np.int64))
    assert torch.equal(inputs[0], ids[:40]) and torch.equal(targets[1], ids[41:81])
    assert torch.equal(inputs[2], ids[59:99]) and (targets[2] != -100).sum() == 99 - 80
    assert torch.equal(targets[2][-19:], ids[-19:])


def test_random_windows_are_next_token_pairs_anywhere_in_the_split():
    data = np.arange(50)
    x, y = random_windows(batch_rng(0, 0, 0), 4000, data, seq_len=10)
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y[:, -1], x[:, -1] + 1)
    assert torch.equal(x, x[:, :1] + torch.arange(10))  # contiguous
    assert set(x[:, 0].tolist()) == set(range(50 - 10))  # every offset, the last one included


def test_training_windows_come_from_the_training_split_only(text_file):
    path, _ = text_file
    dm = TextDataModule(str(path), seq_len=16, batch_size=64, seed=2)
    dm.setup()
    train_text = dm.tokenizer.decode(dm.train_data.tolist())
    batches = iter(dm.train_dataloader())
    for _ in range(3):
        x, y = next(batches)
        for row_x, row_y in zip(x.tolist(), y.tolist()):
            assert dm.tokenizer.decode(row_x + row_y[-1:]) in train_text


def test_same_seed_same_windows(text_file):
    path, _ = text_file
    a, b, c = (TextDataModule(str(path), seq_len=8, seed=s) for s in (0, 0, 1))
    xa, xb, xc = (next(iter(dm.train_dataloader()))[0] for dm in (a, b, c))
    assert torch.equal(xa, xb) and not torch.equal(xa, xc)


def test_bad_files_and_settings_are_named(tmp_path, text_file):
    path, _ = text_file
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    one_char = tmp_path / "one.txt"
    one_char.write_text("x")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 ".encode("latin-1") * 50)
    cases = [
        (dict(path=str(tmp_path / "missing.txt")), "data.path", "no file there"),
        (dict(path=str(empty)), "data.path", "empty"),
        (dict(path=str(latin1)), "data.path", "not UTF-8"),
        (dict(path=str(path), vocab="word"), "data.vocab", "char"),
        (dict(path=str(path), seq_len=100), "data.seq_len", "at most 99"),  # 100 validation characters
        (dict(path=str(one_char)), "data.path", "0 training and 1 validation tokens"),  # no window fits at all
        (dict(path=str(tmp_path)), "data.path", "a directory there"),
        (dict(path=str(path), seq_len=0), "data.seq_len", "integer"),
        (dict(path=str(path), val_fraction=1.0), "data.val_fraction", "between 0 and 1"),
        (dict(path=str(path), batch_size=0), "data.batch_size", "integer"),
        (dict(path=str(path), seq_len=16, eval_seq_len=100), "data.eval_seq_len", "at most 99"),
        (dict(path=str(path), seq_len=16, eval_seq_len=0), "data.eval_seq_len", "integer"),
    ]
    for kwargs, field, hint in cases:
        with pytest.raises(ConfigError) as err:
            TextDataModule(**kwargs)
        assert err.value.field == field and hint in str(err.value), (kwargs, str(err.value))
    TextDataModule(str(path), seq_len=99)  # the longest window that fits


def test_unseen_characters_are_listed_up_to_ten_and_the_rest_counted():
    from archlab.tokenizer import CharTokenizer

    tokenizer = CharTokenizer("abc")
    with pytest.raises(ValueError) as thirteen:
        tokenizer.encode("abc" + "DEFGHIJKLMNOP")  # 13 unseen, in sorted order D..P
    assert str(thirteen.value) == (f"characters not in the vocabulary: {list('DEFGHIJKLM')!r} and 3 more (13 in all)")
    with pytest.raises(ValueError) as two:
        tokenizer.encode("aXbY")
    assert str(two.value) == "characters not in the vocabulary: ['X', 'Y']"
