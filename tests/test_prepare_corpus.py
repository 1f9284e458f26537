"""archlab-prepare on corpora: JSONL, Parquet and datasets directories tokenised with a pretrained
tokenizer (a tokenizer.json, a model directory) into shards equal to the tokenizer's own encoding of each
document followed by EOS; the document split; workers and a continued run give the same bytes; every
refusal before any work."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

import archlab.data.chunks
from archlab.cli.prepare import PrepareConfig, prepare
from archlab.errors import ConfigError

EOS = "<|endoftext|>"
# 20 documents of different lengths (one empty: it is still a document, its EOS alone)
DOCS = [
    f"Document {i}: the {'quick ' * (i % 4)}brown fox jumps over the lazy dog {i * 37}." if i != 5 else ""
    for i in range(20)
]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    """A byte-level BPE of a few hundred merges with an EOS special token, as a tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<pad>", EOS], initial_alphabet=alphabet)
    tok.train_from_iterator(["A small text, for merges: the lazy dog and the quick brown fox. " * 3, *DOCS], trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def encoded(tokenizer_file, docs):
    """The expectation: each document as the tokenizers library encodes it, followed by the EOS id."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    eos = tok.token_to_id(EOS)
    return [i for doc in docs for i in [*tok.encode(doc, add_special_tokens=False).ids, eos]]


def write_jsonl(path, docs, field="text"):
    path.write_text("".join(json.dumps({"id": n, field: d}) + "\n" for n, d in enumerate(docs)), encoding="utf-8")
    return path


def shards(out):
    return [np.fromfile(out / f"{split}.bin", dtype="<u2").tolist() for split in ("train", "val")]


def run(tmp_path, source, out="shards", **settings):
    cfg = PrepareConfig(input=str(source), output=str(tmp_path / out), workers=1, chunk_documents=3, **settings)
    return prepare(cfg)


def test_jsonl_shards_are_each_document_encoded_then_eos(tmp_path, tokenizer_file):
    source = write_jsonl(tmp_path / "corpus.jsonl", DOCS)
    meta = run(tmp_path, source, tokenizer=str(tokenizer_file), val_fraction=0.25)
    val = [3, 7, 11, 15, 19]  # floor((i + 1) / 4) steps up at every fourth document
    train_docs = [d for i, d in enumerate(DOCS) if i not in val]
    expected = [encoded(tokenizer_file, train_docs), encoded(tokenizer_file, [DOCS[i] for i in val])]
    assert shards(tmp_path / "shards") == expected
    assert meta["eos_id"] == 1 and meta["eos_token"] == EOS and meta["dtype"] == "uint16"
    assert (meta["train_documents"], meta["val_documents"]) == (15, 5)
    assert (meta["train_tokens"], meta["val_tokens"]) == tuple(map(len, expected))
    sha = hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()
    assert meta["tokenizer_file"] == {"path": str(tokenizer_file.resolve()), "sha256": sha}
    assert meta["sources"] == [str(source.resolve())] and meta["split"] == "documents"
    assert json.loads((tmp_path / "shards" / "meta.json").read_text()) == meta
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_parquet_files_a_glob_a_datasets_directory_and_gzip_give_the_same_shards(tmp_path, tokenizer_file):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = run(tmp_path, write_jsonl(tmp_path / "c.jsonl", DOCS), "jsonl", tokenizer=str(tokenizer_file))
    expected = shards(tmp_path / "jsonl")
    parts = tmp_path / "parquet"
    parts.mkdir()
    for n, (a, b) in enumerate([(0, 8), (8, 20)]):  # two files, read in name order
        pq.write_table(pa.table({"content": DOCS[a:b], "n": list(range(a, b))}), parts / f"part-{n}.parquet")
    datasets.Dataset.from_dict({"content": DOCS}).save_to_disk(str(tmp_path / "saved"))
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(write_jsonl(tmp_path / "content.jsonl", DOCS, "content").read_bytes()))
    sources = [(parts, "parquet"), (f"{parts}/*.parquet", "parquet"), (tmp_path / "saved", "datasets"), (gz, "jsonl")]
    for n, (source, fmt) in enumerate(sources):
        meta = run(tmp_path, source, f"out{n}", tokenizer=str(tokenizer_file), text_field="content")
        assert meta["format"] == fmt and shards(tmp_path / f"out{n}") == expected
        assert meta["train_documents"] + meta["val_documents"] == jsonl["train_documents"] + jsonl["val_documents"]


def test_a_model_directory_declares_its_eos(tmp_path, tokenizer_file):
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_bytes(tokenizer_file.read_bytes())
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<pad>"}}))
    meta = run(tmp_path, write_jsonl(tmp_path / "c.jsonl", DOCS[:10]), tokenizer=str(model))
    assert (meta["eos_token"], meta["eos_id"]) == ("<pad>", 0)  # the directory's, not the usual name
    train = shards(tmp_path / "shards")[0]
    assert train.count(0) == meta["train_documents"] == 9 and train[-1] == 0


def test_a_bpe_fitted_to_a_corpus_gets_an_eos(tmp_path):
    from tokenizers import Tokenizer

    meta = run(tmp_path, write_jsonl(tmp_path / "c.jsonl", DOCS), tokenizer="bpe", vocab_size=300)
    saved = tmp_path / "shards" / "tokenizer.json"
    tok = Tokenizer.from_file(str(saved))
    assert meta["eos_id"] == tok.token_to_id(EOS) == 0 and 256 < meta["vocab_size"] <= 300
    val = [9, 19]
    expected = [encoded(saved, [d for i, d in enumerate(DOCS) if i not in val]), encoded(saved, [DOCS[i] for i in val])]
    assert shards(tmp_path / "shards") == expected


def test_two_workers_write_the_bytes_one_does(tmp_path, tokenizer_file):
    source = write_jsonl(tmp_path / "c.jsonl", DOCS * 3)
    run(tmp_path, source, "one", tokenizer=str(tokenizer_file))
    prepare(PrepareConfig(input=str(source), output=str(tmp_path / "two"), tokenizer=str(tokenizer_file),
                          workers=2, chunk_documents=3))  # fmt: skip
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


class Interrupted(Exception):
    """The run stopped from outside (a kill, Ctrl-C) after some chunks were written."""


def test_an_interrupted_run_continues_to_the_same_bytes(tmp_path, tokenizer_file, monkeypatch):
    source = write_jsonl(tmp_path / "c.jsonl", DOCS)  # 7 chunks of 3 documents (the last of 2)
    settings = {"tokenizer": str(tokenizer_file)}
    run(tmp_path, source, "whole", **settings)
    encode, calls, stop_after = archlab.data.chunks.encode_chunk, [], [3]

    def interrupted(index, *args):
        if len(calls) == stop_after[0]:
            raise Interrupted
        calls.append(index)
        return encode(index, *args)

    monkeypatch.setattr(archlab.data.chunks, "encode_chunk", interrupted)
    with pytest.raises(Interrupted):
        run(tmp_path, source, **settings)
    out = tmp_path / "shards"
    assert not (out / "meta.json").exists() and (out / "progress.json").is_file()
    with pytest.raises(ConfigError) as err:  # other settings would mix two runs' chunks
        run(tmp_path, source, val_fraction=0.2, **settings)
    assert err.value.field == "val_fraction"
    calls.clear()
    stop_after[0] = -1
    meta = run(tmp_path, source, **settings)
    assert calls == [3, 4, 5, 6]  # only the chunks the first run did not finish
    for name in ("train.bin", "val.bin"):
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    assert meta == json.loads((tmp_path / "whole" / "meta.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_a_continued_run_refuses_an_input_edited_since(tmp_path, tokenizer_file, monkeypatch):
    """An edit that keeps the document count (and here the size) must not be joined to the chunks encoded
    from the file before it: the progress record holds each file's size and modification time."""
    source = write_jsonl(tmp_path / "c.jsonl", DOCS)
    encode = archlab.data.chunks.encode_chunk

    def interrupted(index, *args):
        if index == 2:
            raise Interrupted
        return encode(index, *args)

    monkeypatch.setattr(archlab.data.chunks, "encode_chunk", interrupted)
    with pytest.raises(Interrupted):
        run(tmp_path, source, tokenizer=str(tokenizer_file))
    monkeypatch.setattr(archlab.data.chunks, "encode_chunk", encode)
    before = source.stat()
    source.write_text(source.read_text().replace("quick", "QUICK"))  # the same documents, bytes and lines
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))  # a second later, on any file system
    assert source.stat().st_size == before.st_size
    with pytest.raises(ConfigError) as err:
        run(tmp_path, source, tokenizer=str(tokenizer_file))
    assert err.value.field == "input" and err.value.value == str(source.resolve())
    assert f"{before.st_size} bytes" in str(err.value) and "progress.json deleted to start afresh" in str(err.value)
    assert not (tmp_path / "shards" / "meta.json").exists()
    (tmp_path / "shards" / "progress.json").unlink()  # as the error says: start afresh, from the edited file
    run(tmp_path, source, tokenizer=str(tokenizer_file))
    edited = [d.replace("quick", "QUICK") for d in DOCS]
    val = [9, 19]  # the documents that validate at val_fraction=0.1
    expected = [
        encoded(tokenizer_file, [d for i, d in enumerate(edited) if i not in val]),
        encoded(tokenizer_file, [edited[i] for i in val]),
    ]
    assert shards(tmp_path / "shards") == expected


def big_vocabulary(tmp_path):
    """A word-level tokenizer of 70,000 ids (more than uint16 holds) with an EOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {EOS: 0, **{f"w{i}": i + 1 for i in range(69_999)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([EOS])
    path = tmp_path / "big.json"
    tok.save(str(path))
    return path


def test_refusals_name_the_field_before_any_work(tmp_path, tokenizer_file):
    from tokenizers import Tokenizer, models

    good = write_jsonl(tmp_path / "good.jsonl", DOCS)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    no_eos = tmp_path / "no_eos.json"
    Tokenizer(models.BPE()).save(str(no_eos))
    table = tmp_path / "table.csv"
    table.write_text("text\nhello\n")
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": DOCS})}).save_to_disk(str(tmp_path / "dd"))
    import pyarrow as pa
    import pyarrow.parquet as pq

    numbers = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"text": [1, 2, 3]}), numbers)
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet")
    nulls = write_jsonl(tmp_path / "nulls.jsonl", [None, "x"])
    tok = str(tokenizer_file)
    cases = [
        ({"input": numbers, "tokenizer": tok}, "text_field", "a column of text: in"),
        ({"input": fake, "tokenizer": tok}, "input", "a parquet file pyarrow reads"),
        ({"input": nulls, "tokenizer": tok}, "text_field", "(its first record) holds None"),
        ({"input": blank, "tokenizer": tok}, "input", "no records"),
        ({"input": good, "tokenizer": tok, "text_field": "body"}, "text_field", "has ['id', 'text']"),
        ({"input": good, "tokenizer": str(big_vocabulary(tmp_path)), "dtype": "uint16"}, "dtype", "70000 ids"),
        ({"input": table, "tokenizer": tok}, "format", ".csv is none"),
        ({"input": good, "tokenizer": tok, "format": "xml"}, "format", "one of"),
        ({"input": good, "tokenizer": str(no_eos)}, "eos", "declares no EOS"),
        ({"input": good, "tokenizer": tok, "eos": "<end>"}, "eos", "a token of the vocabulary"),
        ({"input": good, "tokenizer": "char"}, "tokenizer", "bpe or a pretrained tokenizer"),
        ({"input": good, "tokenizer": str(tmp_path)}, "tokenizer", "holds no tokenizer.json"),
        ({"input": good, "tokenizer": tok, "vocab_size": 512}, "vocab_size", "null for a pretrained"),
        ({"input": tmp_path / "dd", "tokenizer": tok}, "input", "one split"),
        ({"input": write_jsonl(tmp_path / "two.jsonl", DOCS[:2]), "tokenizer": tok}, "input", "empty split"),
        ({"input": good, "tokenizer": tok, "workers": 0}, "workers", "a positive integer"),
    ]
    for settings, field, says in cases:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in settings.items()}
        out = tmp_path / "never"
        with pytest.raises(ConfigError) as err:
            prepare(PrepareConfig(output=str(out), **settings))
        assert err.value.field == field and says in str(err.value), (settings, err.value)
        assert not out.exists()


def test_a_text_file_with_a_pretrained_tokenizer_splits_by_tokens_without_eos(tmp_path, tokenizer_file):
    from tokenizers import Tokenizer

    text = " ".join(DOCS)
    source = tmp_path / "plain.txt"
    source.write_text(text, encoding="utf-8")
    meta = run(tmp_path, source, tokenizer=str(tokenizer_file))
    ids = Tokenizer.from_file(str(tokenizer_file)).encode(text).ids
    cut = int(len(ids) * 0.9)  # the text file's split, by tokens
    assert shards(tmp_path / "shards") == [ids[:cut], ids[cut:]] and "eos_id" not in meta
    assert meta["tokenizer_file"]["sha256"] == hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()


PREFIX = b'{"id": 2, "text": "Document '  # line 3 of write_jsonl's file up to the byte made invalid


@pytest.mark.parametrize(
    "name, damage, says",
    [
        (
            "bad.jsonl",
            lambda raw: raw.replace(PREFIX + b"2", PREFIX + b"\xff"),
            f"(line 3: byte {len(PREFIX) + 1} of the line is not UTF-8)",
        ),
        ("cut.jsonl.gz", lambda raw: gzip.compress(raw)[:-30], "a whole gzip file (after line"),
        ("plain.jsonl.gz", lambda raw: raw, "a gzip file, as its name says (Not a gzipped file"),
    ],
)
def test_unreadable_jsonl_is_one_line_naming_the_file(tmp_path, tokenizer_file, capsys, name, damage, says):
    from archlab.cli.prepare import main

    raw = write_jsonl(tmp_path / "c.jsonl", DOCS).read_bytes()
    source = tmp_path / name
    source.write_bytes(damage(raw))
    with pytest.raises(SystemExit) as exit_:
        main([f"input={source}", f"output={tmp_path / 'never'}", f"tokenizer={tokenizer_file}"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: input='{source}' is invalid: allowed ") and says in err, err


def test_an_evaluation_only_preparation_encodes_held_out_documents_with_a_training_runs_tokenizer(tmp_path):
    """val_fraction=1: a held-out set encoded with the tokenizer a training corpus was prepared with, every
    document validating and no train.bin (nothing of it can leak into training), read by archlab-eval's
    perplexity as shards of the training run's own tokenizer."""
    from archlab.data import TokensDataModule
    from archlab.evaluation.perplexity import read_held_out
    from archlab.tokenizer import tokenizer_from_dict

    train = run(tmp_path, write_jsonl(tmp_path / "train.jsonl", DOCS), "train", tokenizer="bpe", vocab_size=300)
    held_out = [f"A held-out document, number {i}, about the lazy dog." for i in range(4)]
    test_jsonl = write_jsonl(tmp_path / "test.jsonl", held_out)
    meta = run(tmp_path, test_jsonl, "test", tokenizer=str(tmp_path / "train"), val_fraction=1.0)
    out = tmp_path / "test"
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "val.bin"]
    expected = encoded(tmp_path / "train" / "tokenizer.json", held_out)  # each document, then the EOS
    assert np.fromfile(out / "val.bin", dtype="<u2").tolist() == expected
    assert (meta["train_documents"], meta["val_documents"]) == (0, 4)
    assert (meta["train_tokens"], meta["val_tokens"]) == (0, len(expected))
    assert meta["tokenizer"] == train["tokenizer"] and meta["eos_id"] == train["eos_id"]
    read = read_held_out(str(out), tokenizer_from_dict(train["tokenizer"]), train["vocab_size"])
    assert read.ids.tolist() == expected and read.eos_id == train["eos_id"]
    with pytest.raises(ConfigError) as err:
        TokensDataModule(str(out), seq_len=4)
    assert err.value.field == "data.dir" and "evaluation-only preparation" in str(err.value)
    text = tmp_path / "held_out.txt"  # a text file, with the byte vocabulary (fixed: no fitting)
    text.write_text(" ".join(held_out), encoding="utf-8")
    assert run(tmp_path, text, "bytes", tokenizer="byte", val_fraction=1.0)["val_tokens"] == len(text.read_bytes())
    assert np.fromfile(tmp_path / "bytes" / "val.bin", dtype="<u2").tolist() == list(text.read_bytes())
    assert not (tmp_path / "bytes" / "train.bin").exists()
    for source, settings, field, says in [
        (test_jsonl, {"tokenizer": "bpe", "vocab_size": 300}, "tokenizer", "a training run's tokenizer"),
        (text, {"tokenizer": "char"}, "tokenizer", "a training run's tokenizer"),
        (test_jsonl, {"tokenizer": str(tmp_path / "train"), "out": "train"}, "output", "holds shards to train on"),
        (
            test_jsonl,
            {"tokenizer": str(tmp_path / "train"), "out": "test", "val_fraction": 0.5},
            "output",
            "holds an evaluation-only",
        ),
    ]:
        with pytest.raises(ConfigError) as err:
            run(tmp_path, source, **{"out": "never", "val_fraction": 1.0, **settings})
        assert err.value.field == field and says in str(err.value), (settings, str(err.value))
    assert not (tmp_path / "never").exists() and (tmp_path / "train" / "train.bin").is_file()
