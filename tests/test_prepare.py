"""archlab-prepare: shards equal to the tokenizer's encoding, dtype choice, BPE, clear errors."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import archlab
import archlab.tokenizer
from archlab.cli.prepare import PrepareConfig, main, prepare
from archlab.data.common import token_dtype
from archlab.errors import ConfigError
from archlab.tokenizer import tokenizer_from_dict

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 12


def run_prepare(*args: str) -> subprocess.CompletedProcess:
    """The installed console script, as a user runs it."""
    script = Path(sys.executable).with_name("archlab-prepare")
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "hamlet.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def read_back(out, dtype):
    return [
        np.fromfile(out / f"{split}.bin", dtype=np.dtype(dtype).newbyteorder("<")).tolist()
        for split in ("train", "val")
    ]


@pytest.mark.parametrize("kind, given", [("char", "input={}"), ("byte", "{}")])  # a bare path is the input
def test_cli_writes_shards_equal_to_the_tokenizer_encoding(tmp_path, source, kind, given):
    out = tmp_path / "shards"
    proc = run_prepare(given.format(source), f"output={out}", f"tokenizer={kind}")
    assert proc.returncode == 0, proc.stderr
    assert f"data.dir={out}" in proc.stdout  # it says how to train on the result
    meta = json.loads((out / "meta.json").read_text())
    tokenizer = tokenizer_from_dict(meta["tokenizer"])
    ids = tokenizer.encode(TEXT)
    cut = int(len(ids) * 0.9)
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == (len(set(TEXT)) if kind == "char" else 256)
    assert (meta["train_tokens"], meta["val_tokens"]) == (cut, len(ids) - cut)
    assert read_back(out, "uint16") == [ids[:cut], ids[cut:]]
    assert (out / "train.bin").stat().st_size == 2 * cut  # raw uint16, no header (nanoGPT's format)


def test_bpe_is_trained_locally_and_saved_beside_the_shards(tmp_path, source):
    from tokenizers import Tokenizer

    out = tmp_path / "bpe"
    meta = prepare(PrepareConfig(input=str(source), output=str(out), tokenizer="bpe", vocab_size=300, val_fraction=0.2))
    library = Tokenizer.from_file(str(out / "tokenizer.json"))  # the tokenizers library's own file
    ids = library.encode(TEXT).ids
    assert 256 < meta["vocab_size"] <= 300 and meta["vocab_size"] == library.get_vocab_size()
    assert len(ids) < len(TEXT.encode()) / 1.5  # merges learned from this text compress it
    cut = int(len(ids) * 0.8)
    assert read_back(out, "uint16") == [ids[:cut], ids[cut:]]
    tokenizer = tokenizer_from_dict(meta["tokenizer"])
    assert tokenizer.decode(sum(read_back(out, "uint16"), [])) == TEXT


def test_a_bpe_vocabulary_the_text_cannot_fill_is_reported(tmp_path, source, capsys):
    main([f"input={source}", f"output={tmp_path / 'bpe'}", "tokenizer=bpe", "vocab_size=100000"])
    meta = json.loads((tmp_path / "bpe" / "meta.json").read_text())
    assert 256 < meta["vocab_size"] < 400  # TEXT has a few dozen distinct words
    assert f"note: the text gave {meta['vocab_size']} tokens, fewer than vocab_size=100000" in capsys.readouterr().out


def test_dtype_is_uint16_up_to_65536_ids():
    assert token_dtype(256) == token_dtype(2**16) == "uint16"
    assert token_dtype(2**16 + 1) == token_dtype(128256) == "uint32"


@pytest.mark.parametrize(
    "args,field",
    [
        ({"tokenizer": "word"}, "tokenizer"),
        ({"tokenizer": "bpe"}, "vocab_size"),
        ({"tokenizer": "bpe", "vocab_size": 200}, "vocab_size"),
        ({"tokenizer": "char", "vocab_size": 500}, "vocab_size"),
        ({"val_fraction": 0.0}, "val_fraction"),
    ],
)
def test_bad_settings_are_named_before_anything_is_written(tmp_path, source, args, field):
    out = tmp_path / "never"
    with pytest.raises(ConfigError) as err:
        prepare(PrepareConfig(input=str(source), output=str(out), **args))
    assert err.value.field == field and not out.exists()


def test_missing_empty_and_too_short_inputs(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    one = tmp_path / "one.txt"
    one.write_text("x")  # one token cannot be split 90/10
    for path, hint in [(tmp_path / "missing.txt", "no file there"), (empty, "empty"), (one, "empty split")]:
        with pytest.raises(ConfigError) as err:
            prepare(PrepareConfig(input=str(path), output=str(tmp_path / "out")))
        assert err.value.field == "input" and hint in str(err.value)


def test_cli_errors_are_one_line_naming_the_key(tmp_path, source, capsys):
    proc = run_prepare(f"input={tmp_path / 'missing.txt'}", f"output={tmp_path / 'o'}")
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: input=")
    assert "Traceback" not in proc.stderr
    a_file = tmp_path / "taken.txt"
    a_file.write_text("x")
    for argv, key, reason in [
        ([f"input={source}"], "output", "a value (required): the directory"),
        ([f"input={source}", "output=o", "colour=red"], "colour", "key=value with a key among"),
        ([f"input={source}", "output=o", "val_fraction=lots"], "val_fraction", "a value of type float"),
        ([str(source), "o"], "input", f"one value for input (also given as '{source}')"),  # one bare path only
        ([f"input={tmp_path}", "output=o"], "input", "(a directory there)"),
        # checked before the text is read and tokenised: a file, or a place this user cannot write
        ([f"input={source}", f"output={a_file}"], "output", "this path is a file"),
        ([f"input={source}", f"output={a_file / 'sub'}"], "output", f"({a_file} is a file)"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith(f"error: {key}=") and reason in err, err
        assert len(err.strip().splitlines()) == 1


def test_every_tokenizer_function_has_a_caller():
    """A tokenizer travels as its to_dict() inside meta.json and safetensors metadata, read back by
    tokenizer_from_dict; each module-level function of archlab/tokenizer.py is called from another
    archlab module (a JSON-file save/load pair that nothing called once sat there)."""
    module = Path(archlab.tokenizer.__file__)
    functions = {
        node.name for node in ast.parse(module.read_text(encoding="utf-8")).body if isinstance(node, ast.FunctionDef)
    }
    used = set()
    for path in Path(archlab.__file__).parent.rglob("*.py"):
        if path != module:
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Name):
                    used.add(node.id)
                elif isinstance(node, ast.Attribute):
                    used.add(node.attr)
    assert "tokenizer_from_dict" in functions
    assert functions <= used, f"called nowhere in archlab: {sorted(functions - used)}"


def test_another_tokenizer_is_refused_where_shards_were_prepared_and_the_directory_kept(tmp_path, source):
    """A char preparation over a BPE one would overwrite the shards and leave the BPE's tokenizer.json
    beside them: refused, naming the directory and both tokenizers; the same tokenizer prepares again."""
    out = tmp_path / "shards"
    prepare(PrepareConfig(input=str(source), output=str(out), tokenizer="bpe", vocab_size=300))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    another_text = tmp_path / "another.txt"
    another_text.write_text("Something else entirely, in other words. " * 20)
    prepare(PrepareConfig(input=str(another_text), output=str(tmp_path / "another"), tokenizer="bpe", vocab_size=300))
    another = tmp_path / "another" / "tokenizer.json"
    assert another.read_bytes() != before["tokenizer.json"]
    for other in ("char", str(another)):
        with pytest.raises(ConfigError) as err:
            prepare(PrepareConfig(input=str(source), output=str(out), tokenizer=other))
        says = str(err.value)
        assert err.value.field == "output" and f"{out} holds shards made with tokenizer=bpe" in says, says
        assert f"this run's is tokenizer={other}" in says
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    meta = prepare(PrepareConfig(input=str(source), output=str(out), tokenizer="bpe", vocab_size=270))  # fitted again
    assert meta["vocab_size"] <= 270 and sorted(before) == sorted(p.name for p in out.iterdir())
    meta = prepare(PrepareConfig(input=str(source), output=str(out), tokenizer=str(out)))  # its own tokenizer.json
    assert meta["tokenizer_file"]["path"] == str((out / "tokenizer.json").resolve())
    prepare(PrepareConfig(input=str(source), output=str(tmp_path / "chars")))
    with pytest.raises(ConfigError) as err:
        prepare(PrepareConfig(input=str(source), output=str(tmp_path / "chars"), tokenizer="byte"))
    assert "made with tokenizer=char, this run's is tokenizer=byte" in str(err.value)
