"""data=tokens: memory-mapped shards read back as written, uint16 and uint32, meta.json, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from archlab.cli.prepare import PrepareConfig, prepare
from archlab.data import TokensDataModule
from archlab.data.windows import ValidationWindows
from archlab.errors import ConfigError

TEXT = "the quick brown fox jumps over the lazy dog; " * 40


@pytest.fixture
def shards(tmp_path):
    source = tmp_path / "fox.txt"
    source.write_text(TEXT)
    out = tmp_path / "char"
    prepare(PrepareConfig(input=str(source), output=str(out), tokenizer="char"))
    return out


def write_raw(directory, dtype, train, val):
    directory.mkdir(parents=True, exist_ok=True)
    for name, ids in (("train", train), ("val", val)):
        np.asarray(ids, dtype=np.dtype(dtype).newbyteorder("<")).tofile(directory / f"{name}.bin")
    return directory


def test_prepared_shards_read_back_as_the_tokenizer_encoding(shards):
    dm = TokensDataModule(str(shards), seq_len=16, batch_size=4)
    assert dm.vocab_size == len(set(TEXT)) and dm.max_seq_len == 16 and dm.chance_accuracy is None
    ids = dm.tokenizer.encode(TEXT)
    cut = int(len(ids) * 0.9)
    dm.setup()
    assert isinstance(dm.train_data, np.memmap) and dm.train_data.dtype == np.dtype("<u2")
    assert dm.train_data.tolist() == ids[:cut] and dm.val_data.tolist() == ids[cut:]
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 16) and x.dtype == torch.long and torch.equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        assert dm.tokenizer.decode(row_x + row_y[-1:]) in TEXT[:cut]
    (loader,) = dm.val_dataloader()
    assert sum(len(b[0]) for b in loader) == len(ValidationWindows(dm.val_data, 16)) == -(-(len(ids) - cut - 1) // 16)


def test_uint32_shards_without_meta_keep_ids_above_65535(tmp_path):
    rng = np.random.default_rng(0)
    train, val = rng.integers(60000, 70000, 500), rng.integers(60000, 70000, 100)
    d = write_raw(tmp_path / "u32", "uint32", train, val)
    dm = TokensDataModule(str(d), seq_len=10, vocab_size=70000, dtype="uint32")
    assert dm.tokenizer is None and dm.vocab_size == 70000 and dm.counts == {"train": 500, "val": 100}
    dm.setup()
    assert dm.train_data.tolist() == train.tolist() and dm.val_data.tolist() == val.tolist()
    x, _ = ValidationWindows(dm.val_data, 10)[2]
    assert x.tolist() == val[20:30].tolist() and max(train) > 65535


def test_uint16_read_as_uint32_is_caught_by_its_size(tmp_path):
    d = write_raw(tmp_path / "odd", "uint16", range(101), range(51))  # 202 and 102 bytes
    with pytest.raises(ConfigError) as err:
        TokensDataModule(str(d), seq_len=4, vocab_size=200, dtype="uint32")
    assert err.value.field == "data.dir" and "uint32" in str(err.value)


def test_bad_directories_and_settings_are_named(tmp_path, shards):
    missing_val = write_raw(tmp_path / "noval", "uint16", range(100), [])
    (missing_val / "val.bin").unlink()
    cases = [
        (dict(dir=str(tmp_path / "nowhere")), "data.dir", "a directory"),
        (dict(dir=str(missing_val), vocab_size=100, dtype="uint16"), "data.dir", "val.bin"),
        (dict(dir=str(missing_val)), "data.vocab_size", "no meta.json"),
        (dict(dir=str(missing_val), vocab_size=100, dtype="int8"), "data.dtype", "uint16"),
        (dict(dir=str(shards), vocab_size=999), "data.vocab_size", "meta.json"),
        (dict(dir=str(shards), seq_len=10_000), "data.seq_len", "at most"),
    ]
    for kwargs, field, hint in cases:
        with pytest.raises(ConfigError) as err:
            TokensDataModule(**kwargs)
        assert err.value.field == field and hint in str(err.value), (kwargs, str(err.value))
    meta = json.loads((shards / "meta.json").read_text())
    TokensDataModule(str(shards), seq_len=meta["val_tokens"] - 1)  # the longest window that fits


def test_a_meta_eos_id_outside_the_vocabulary_is_refused_as_the_command_line_one_is(tmp_path):
    """eos_id 600 with a vocabulary of 512 would mask nothing (no id of the shards is 600): meta.json's value
    is held to the range data.eos_id is."""
    d = write_raw(tmp_path / "eos", "uint16", [1, 2, 511] * 20, [3, 4, 5] * 10)
    meta = {"vocab_size": 512, "dtype": "uint16"}
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError) as given:
        TokensDataModule(str(d), seq_len=4, document_mask=True, eos_id=600)
    assert given.value.field == "data.eos_id" and "[0, 512)" in str(given.value)
    (d / "meta.json").write_text(json.dumps({**meta, "eos_id": 600}))
    with pytest.raises(ConfigError) as err:
        TokensDataModule(str(d), seq_len=4, document_mask=True)
    assert err.value.field == "data.dir" and "[0, 512)" in str(err.value)
    assert f"{d / 'meta.json'} says eos_id=600" in str(err.value)
    (d / "meta.json").write_text(json.dumps({**meta, "eos_id": 511}))  # the largest id is one
    assert TokensDataModule(str(d), seq_len=4, document_mask=True).documents == {
        "eos_id": 511,
        "reset_positions": False,
    }


def test_a_vocabulary_larger_than_the_shard_dtype_holds_is_refused(tmp_path):
    """uint16 shards hold ids below 65536: a vocabulary of 70,000 with them means ids that wrapped around
    when written (70,000 -> 4464), which no later check can see."""
    d = write_raw(tmp_path / "u16", "uint16", range(100), range(50))
    with pytest.raises(ConfigError) as given:
        TokensDataModule(str(d), seq_len=4, vocab_size=70_000, dtype="uint16")
    assert given.value.field == "data.dtype" and "holds 65536" in str(given.value)
    (d / "meta.json").write_text(json.dumps({"vocab_size": 70_000, "dtype": "uint16"}))
    with pytest.raises(ConfigError) as err:
        TokensDataModule(str(d), seq_len=4)
    assert err.value.field == "data.dir" and "meta.json is uint16, which holds 65536" in str(err.value)
    (d / "meta.json").write_text(json.dumps({"vocab_size": 2**16, "dtype": "uint16"}))  # ids 0..65535 fit
    assert TokensDataModule(str(d), seq_len=4).vocab_size == 65536
